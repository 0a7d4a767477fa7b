# argv: PATH. Writes stdin to PATH, creating parent directories; exit 21 when PATH is a directory,
# 22 when it is a device, FIFO or socket.
dir=${1%/*}
[ -n "$dir" ] && { mkdir -p -- "$dir" || exit 1; }
[ -d "$1" ] && exit 21
[ -e "$1" ] && [ ! -f "$1" ] && exit 22
exec cat >"$1"
