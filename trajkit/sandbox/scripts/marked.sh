# A shell function for backends whose execs mark their processes with TRAJKIT_EXEC_ID=MARKER in the
# environment, to find them again when the exec ends (trajkit_singularity, trajkit_modal).
#
# marked PID MARKER: whether process PID carries TRAJKIT_EXEC_ID=MARKER in its initial environment
# (/proc/PID/environ); false when it is gone or unreadable. Shell builtins only, so that it works
# when no process can start (a command may have filled the process limit, and a shell that cannot
# fork exits): `read` drops the NUL bytes between variables, so one line holds several, and a value
# with a newline only makes more lines. Sets marked_line. POSIX sh and BusyBox.
marked() {
    marked_line=
    while IFS= read -r marked_line || [ -n "$marked_line" ]; do
        case $marked_line in *"TRAJKIT_EXEC_ID=$2"*) return 0 ;; esac
        marked_line=
    done 2>/dev/null <"/proc/$1/environ"
    return 1
}
