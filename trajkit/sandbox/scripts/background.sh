# A background process of a sandbox, for backends that have nothing but `exec` (see
# trajkit/sandbox/processes.py). Prefixed with __tk_action, __tk_dir (a directory name of the process's
# own, made in the sandbox's temporary directory) and the action's values. POSIX sh and BusyBox.
#   prepare  make the directory and the FIFO that will be the process's standard input
#   run      run __tk_command with stdin from the FIFO and stdout and stderr into `out`; exit with its
#            status. A `sleep` holds the FIFO open for writing until `close`, so the process sees
#            end of file only then: it inherits the FIFO already open (fd 3), so it holds it from the
#            moment it exists, not from whenever its own open would have run (a `write` in between
#            would otherwise be the only writer, and its end the process's end of file); the group
#            id is kept for `kill`.
#   read     print the size of `out` and its bytes from __tk_offset on: at most __tk_cap of them on
#            stdout, or the first __tk_cap on stdout and the last __tk_cap on stderr when there are more
#   started  succeed once `run` has started the process
#   write    write __tk_data to the FIFO (opened read-write, so it never waits for a reader)
#   close    end the holder of the FIFO: the process reads end of file
#   kill     kill the process group and the holder
d="${TMPDIR:-/tmp}/$__tk_dir"
case $__tk_action in
prepare)
    mkdir -p "$d" && mkfifo "$d/in" && : >"$d/out"
    ;;
run)
    group=$$
    if read -r stat 2>/dev/null </proc/$$/stat; then
        set -- ${stat##*) }
        group=$3
    fi
    echo "$group" >"$d/group"
    exec 3<>"$d/in"
    sleep 2147483647 >&3 3<&- &
    echo $! >"$d/holder"
    exec 3<&-
    ( eval "$__tk_command" ) <"$d/in" >"$d/out" 2>&1
    status=$?
    read -r holder <"$d/holder" && kill "$holder" 2>/dev/null
    exit "$status"
    ;;
read)
    size=$(wc -c <"$d/out") || exit 1
    size=$((size + 0))
    echo "$size"
    new=$((size - __tk_offset))
    if [ "$new" -le $((2 * __tk_cap)) ]; then
        tail -c +$((__tk_offset + 1)) "$d/out" | head -c "$new"
    else
        tail -c +$((__tk_offset + 1)) "$d/out" | head -c "$__tk_cap"
        tail -c "$__tk_cap" "$d/out" >&2
    fi
    ;;
started)
    test -s "$d/holder"
    ;;
write)
    { printf '%s' "$__tk_data" >&3; } 3<>"$d/in"
    ;;
close)
    read -r holder <"$d/holder" && kill "$holder"
    ;;
kill)
    read -r holder <"$d/holder" && kill "$holder" 2>/dev/null
    read -r group <"$d/group" && kill -9 -- "-$group"
    ;;
esac
