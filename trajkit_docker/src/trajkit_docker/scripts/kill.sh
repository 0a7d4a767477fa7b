# Kills the process group that exec.sh recorded; waits briefly in case the deadline came before the
# wrapper had written it. Argument: $1 = the file for the group's id, as exec.sh was given it.
f=$1
i=0
while [ ! -s "$f" ] && [ "$i" -lt 50 ]; do sleep 0.1; i=$((i+1)); done
[ -s "$f" ] && kill -9 -"$(cat "$f")"
