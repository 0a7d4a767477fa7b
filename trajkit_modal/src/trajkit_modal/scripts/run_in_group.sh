# Runs the command ($1, or stdin when $3 is "stdin") in a session and process group of its own,
# marked by TRAJKIT_EXEC_ID=$2 in the environment of everything it starts; when the command's shell
# exits its group is killed, then whatever still carries the mark (sweep.sh: a `setsid` daemon), so
# nothing outlives the exec. The wrapper's and the group's ids go to a file named after the exec
# ($2), for the kill that follows a timeout (kill_group.sh). Reading stdin keeps trailing newlines
# (the "x" guard) for here-documents.
c=$1
if [ "$3" = stdin ]; then c=$(cat; echo x); c=${c%x}; fi
f=${TMPDIR:-/tmp}/.trajkit-exec-$2
sweep_marker=$2
export TRAJKIT_EXEC_ID="$2"
if command -v setsid >/dev/null 2>&1; then setsid /bin/sh -c "$c" & else /bin/sh -c "$c" & fi
p=$!
{ echo "$$ $p" >"$f"; } 2>/dev/null
wait "$p"
rc=$?
kill -9 -"$p" 2>/dev/null
unset TRAJKIT_EXEC_ID
sweep
rm -f "$f"
exit "$rc"
