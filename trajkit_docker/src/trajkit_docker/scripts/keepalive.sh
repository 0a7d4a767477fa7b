# PID 1 of every sandbox. It sleeps in the background and waits, so that it also reaps the orphans
# left when an exec's process group is killed (zombies would count against pids_limit). Every exec
# ends by killing what descends from PID 1 (sweep_orphans.sh), which may include this shell's own
# `sleep` or `date`: a killed sleep is restarted for the time left, a killed `date` (empty output) is
# retried a second later. Once the lifetime is over the shell exits and the engine removes the
# container. Argument: $1 = lifetime in seconds.
trap 'exit 0' TERM INT
end=$(($(date +%s 2>/dev/null || echo 0) + $1))
while :; do
    now=$(date +%s 2>/dev/null)
    case $now in "" | *[!0-9]*) sleep 1 & wait; continue ;; esac
    [ "$now" -lt "$end" ] || exit 0
    sleep $((end - now)) & wait
done
