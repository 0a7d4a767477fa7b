# Prints the regular file $1 whole when it holds at most $2 bytes (at most $2 + 1 bytes of it, in case
# it grows), else its first and last $2/2 bytes; `head` and `tail` seek, so the size between them is
# never read. Exit 22 (READ_NOT_REGULAR) for anything but a regular file (after symlinks), which is
# never opened.
[ -f "$1" ] || { [ -e "$1" ] && exit 22; exit 2; }
size=$(stat -L -c %s -- "$1" 2>/dev/null || wc -c <"$1")
if [ "$size" -le "$2" ]; then exec head -c "$(($2 + 1))" -- "$1"; fi
head -c "$(($2 / 2))" -- "$1" && exec tail -c "$(($2 - $2 / 2))" -- "$1"
