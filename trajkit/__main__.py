from trajkit.cli import main

main()
