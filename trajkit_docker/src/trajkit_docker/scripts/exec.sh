# Runs the command as the leader of a new session, hence of a new process group whose id is the
# leader's pid, and writes that id where a second exec can find it: `docker exec` cannot kill what it
# started, so a timeout is enforced by `kill -9 -PGID` from that second exec (kill.sh). When the
# command ends, the group is killed, then the processes that left it for a session of their own
# (sweep_orphans.sh, which goes first), so background children and daemons never outlive the exec.
# A non-interactive shell does not give `&` jobs their own group, so `setsid` never needs to fork
# and `$!` is the leader. `wait`'s stderr is discarded: shells report a killed job ("Killed")
# there, which is not output.
# Arguments: $1 = the file for the group's id (in the state directory), $2 = command,
# $3 = working directory.
cd "$3" || exit 1
setsid /bin/sh -c "$2" &
pg=$!
f=$1
{ echo "$pg" > "$f.new" && mv -f "$f.new" "$f"; } 2>/dev/null
wait "$pg" 2>/dev/null
rc=$?
kill -9 -"$pg" 2>/dev/null
sweep_orphans
rm -f "$f"
exit "$rc"
