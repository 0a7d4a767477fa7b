# Writes stdin to $1 (absolute) as the user running it, making missing parent directories. Exit 20
# when a parent is no directory, 21 when $1 is a directory, 22 when it is a device, FIFO or socket,
# 13 when the user may not write it or make its parents, 40 when its symlinks loop.
t=$1 d=${1%/*}
[ -n "$d" ] || d=/
if [ ! -d "$d" ]; then
    a=$d
    while [ ! -e "$a" ]; do a=${a%/*}; [ -n "$a" ] || a=/; done
    [ -d "$a" ] || exit 20
    mkdir -p -- "$d" 2>/dev/null || exit 13
fi
[ -d "$t" ] && exit 21
[ -e "$t" ] && [ ! -f "$t" ] && exit 22
if [ -e "$t" ]; then [ -w "$t" ] || exit 13; else [ -w "$d" ] || exit 13; fi
if err=$( { cat > "$t"; } 2>&1 ); then exit 0; fi
case $err in *link* | *loop*) exit 40 ;; esac
exit 1
