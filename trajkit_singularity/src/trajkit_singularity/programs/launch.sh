# argv: COMMAND [NAME=VALUE...], environment: TRAJKIT_EXEC_ID=MARKER. Runs COMMAND, then kills
# whatever it left running.
#
# The marker comes through the environment (APPTAINERENV_TRAJKIT_EXEC_ID on the client) so that this
# shell carries it too and a timeout's sweep stops it with the rest, before it can report its child's
# death. The command runs in the foreground (a background job would start with SIGINT ignored), and
# setsid does not fork there because the child of this shell never leads a process group.
command=$1
shift
[ -n "$TRAJKIT_EXEC_ID" ] || exit 125
for assignment in "$@"; do
    export "$assignment" || exit 125
done
if command -v setsid >/dev/null 2>&1; then
    setsid /bin/sh -c "$command"
else
    /bin/sh -c "$command"
fi
status=$?
sweep "$TRAJKIT_EXEC_ID"
exit "$status"
