# sweep: kills every process carrying the exec's marker ($sweep_marker) in its initial environment,
# and every process in a session one of them leads, except the calling shell; stopped first so that
# none sees another die, repeated because a victim may fork meanwhile. A daemon that both clears its
# environment and starts a session (`env -i setsid daemon &`) escapes it until the sandbox ends:
# unlike Docker's, Modal's exec is not known to keep a parent outside the container, so orphans
# cannot be told apart. Only shell builtins, so that it works when no process can start: the marker
# is looked for by `marked` (trajkit's sandbox/scripts/marked.sh, which goes before this file).
# Functions only: run_in_group.sh follows it.
sweep() {
    sweep_round=0 sweep_sessions=" "
    while [ "$sweep_round" -lt 6 ]; do
        sweep_victims=
        for sweep_proc in /proc/[0-9]*; do
            sweep_pid=${sweep_proc#/proc/}
            [ "$sweep_pid" = "$$" ] && continue
            read -r sweep_stat 2>/dev/null <"$sweep_proc/stat" || continue
            set -- ${sweep_stat##*) }
            [ "$1" = Z ] && continue
            case $sweep_sessions in
            *" $4 "*) ;;
            *)
                marked "$sweep_pid" "$sweep_marker" || continue
                [ "$4" = "$sweep_pid" ] && sweep_sessions="$sweep_sessions$sweep_pid "
                ;;
            esac
            kill -STOP "$sweep_pid" 2>/dev/null && sweep_victims="$sweep_victims $sweep_pid"
        done
        [ -n "$sweep_victims" ] || return 0
        kill -9 $sweep_victims 2>/dev/null
        sweep_round=$((sweep_round + 1))
    done
}
