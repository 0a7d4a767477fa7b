# sweep MARKER: SIGKILL every process of the exec tagged MARKER, every process in a session one of
# them leads, and every orphan, except the calling shell and the instance's init (PID 1). An orphan is
# a process whose oldest ancestor in the instance is that init: a daemon that cleared its environment
# (`env -i setsid daemon &`) is reparented there when its shell exits, whereas every exec has a parent
# outside the instance's PID namespace (parent pid 0), so concurrent execs are left alone. Victims are
# stopped first and killed together, so none sees another die (no shell reports "Killed"); repeated
# because a process may fork between listing and kill. The sweep returns once its victims are reaped
# (by the instance's init, five seconds at most): a killed process holds a slot of the instance's
# process limit until it has exited and been reaped, so an exec that returned sooner could leave the
# next one unable to start (Apptainer's own starter needs a dozen).
#
# Nothing here starts a process: every step is a shell builtin. The sweep runs when the command may
# have filled the instance's process limit, and a shell that cannot fork exits (dash and BusyBox
# ash alike, status 2): the exec's processes would survive it and its status be lost. So the marker
# is looked for by `marked` (trajkit's sandbox/scripts/marked.sh, which goes before this file), and
# the wait for the reaping spins on the clock of /proc/uptime instead of running `sleep`.
#
# reaped SECONDS PID...: waits until none of the PIDs exists any more, or SECONDS have passed.
#
# Functions only: the launch and kill programs are marked.sh, this file, then their own.

uptime_centis() {
    read -r up _ 2>/dev/null </proc/uptime || return 1
    case $up in *[!0-9.]* | *.*.* | .* | *.) return 1 ;; esac
    now=$(( ${up%.*} * 100 + 1${up#*.} - 100 ))
}

reaped() {
    uptime_centis || return 0
    deadline=$(( now + $1 * 100 ))
    shift
    for pid in "$@"; do
        while [ -e "/proc/$pid" ]; do
            uptime_centis && [ "$now" -lt "$deadline" ] || return 0
        done
    done
}

orphan() {
    at=$1 top=
    while [ -n "$at" ] && [ "$at" != 0 ]; do
        read -r st 2>/dev/null <"/proc/$at/stat" || return 1
        set -- ${st##*) }
        top=$at at=$2
    done
    [ "$top" = 1 ]
}

sweep() {
    marker=$1 self=$$ round=0 sessions=" " killed=
    while [ "$round" -lt 6 ]; do
        victims=
        for p in /proc/[0-9]*; do
            pid=${p#/proc/}
            [ "$pid" = "$self" ] || [ "$pid" = 1 ] && continue
            read -r stat 2>/dev/null <"$p/stat" || continue
            set -- ${stat##*) }
            [ "$1" = Z ] && continue
            case $sessions in
            *" $4 "*) ;;
            *)
                orphan "$pid" || marked "$pid" "$marker" || continue
                [ "$4" = "$pid" ] && sessions="$sessions$pid "
                ;;
            esac
            kill -STOP "$pid" 2>/dev/null && victims="$victims $pid"
        done
        [ -n "$victims" ] || break
        kill -9 $victims 2>/dev/null
        killed="$killed$victims"
        round=$((round + 1))
    done
    reaped 5 $killed
}
