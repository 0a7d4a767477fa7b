# argv: MARKER. Run from a second exec when an exec times out.
sweep "$1"
