# argv: PATH LIMIT. Prints the regular file's size on a line, then the file, or only its first and
# last LIMIT/2 bytes when it is larger than LIMIT (at most LIMIT + 1 bytes even if it grows
# meanwhile). Exit 2 when missing, 21 when a directory, 22 when a device, FIFO or socket (which is
# never opened): scripts.py's READER_* constants.
[ -d "$1" ] && exit 21
[ -e "$1" ] || exit 2
[ -f "$1" ] || exit 22
size=$(stat -L -c %s -- "$1" 2>/dev/null) || size=$(wc -c <"$1") || exit 1
echo "$size"
if [ "$size" -le "$2" ]; then exec head -c "$(($2 + 1))" -- "$1"; fi
head -c "$(($2 / 2))" -- "$1" && exec tail -c "$(($2 - $2 / 2))" -- "$1"
