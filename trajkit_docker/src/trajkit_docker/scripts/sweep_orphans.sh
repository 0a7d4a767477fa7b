# sweep_orphans: kills, by SIGKILL, every process of the container that descends from its PID 1
# other than PID 1 itself. What a command left running in a session of its own (`setsid daemon &`)
# is reparented to PID 1 when its shell exits, whereas every exec the engine runs (this one, a
# concurrent one, a killer) has a parent outside the container's PID namespace, so a parent pid of 0.
# Only processes it may signal count (`kill -0`): PID 1 and its `sleep` run as a user of their own
# unless docker.user=image, in which case the `sleep` may be killed too and PID 1 starts another.
# Victims are stopped before they are killed so that none sees another die, and the sweep repeats
# because a victim may fork while it runs. Functions only: exec.sh follows it.
sweep_orphans() {
    sweep_round=0
    while [ "$sweep_round" -lt 8 ]; do
        sweep_victims=
        for sweep_proc in /proc/[0-9]*; do
            sweep_pid=${sweep_proc#/proc/} sweep_at=${sweep_proc#/proc/} sweep_top=
            [ "$sweep_pid" = 1 ] && continue
            while [ -n "$sweep_at" ] && [ "$sweep_at" != 0 ]; do
                read -r sweep_stat 2>/dev/null <"/proc/$sweep_at/stat" || { sweep_top=; break; }
                set -- ${sweep_stat##*) }
                if [ "$sweep_at" = "$sweep_pid" ] && [ "$1" = Z ]; then sweep_top=; break; fi
                sweep_top=$sweep_at sweep_at=$2
            done
            [ "$sweep_top" = 1 ] && kill -0 "$sweep_pid" 2>/dev/null && sweep_victims="$sweep_victims $sweep_pid"
        done
        [ -n "$sweep_victims" ] || return 0
        kill -STOP $sweep_victims 2>/dev/null
        kill -9 $sweep_victims 2>/dev/null
        sweep_round=$((sweep_round + 1))
    done
}
