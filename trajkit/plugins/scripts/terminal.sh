# One `terminal` call that carries on where the previous one left off, as in an interactive shell
# (joined into one line before the command, trajkit/sandbox/shell.py, so that its line numbers stay its own):
# the working directory and the exported variables of the last call are restored before the command
# runs, and saved when it ends (however it ends but by being killed or replacing the shell with
# `exec`). Prefixed with __tk_state (the file of the state, in the sandbox's temporary directory),
# __tk_dir (a directory for this call alone, or empty) and __tk_save (1 to save the state after,
# empty for a background process); the command comes in TRAJKIT_COMMAND and runs through `eval`
# at the end. POSIX sh, BusyBox and bash; every step a builtin.
# Variables named TRAJKIT_* are left out of the state: backends mark each command's processes
# with them, and a mark carried over from an earlier command would hide this one's processes.
if [ -f "$__tk_state" ]; then
    . "$__tk_state" 2>/dev/null
fi
__tk_cwd=${__TK_CWD:-$PWD}
unset __TK_CWD
cd -- "$__tk_cwd" 2>/dev/null
if [ -n "$__tk_dir" ]; then
    cd -- "$__tk_dir" || exit 1
fi
__tk_start=$PWD
if [ -n "$__tk_save" ]; then
    __tk_save() {
        __tk_status=$?
        trap - EXIT
        if [ "$PWD" != "$__tk_start" ] || [ -z "$__tk_dir" ]; then
            __tk_cwd=$PWD
        fi
        export __TK_CWD="$__tk_cwd"
        umask 077
        if export -p >"$__tk_state.all" 2>/dev/null; then
            while IFS= read -r __tk_line; do
                case $__tk_line in
                "declare -x TRAJKIT_"* | "declare -rx TRAJKIT_"* | "export TRAJKIT_"*) ;;
                *) printf '%s\n' "$__tk_line" ;;
                esac
            done <"$__tk_state.all" >"$__tk_state"
        fi
        exit "$__tk_status"
    }
    trap __tk_save EXIT
fi
__tk_command=$TRAJKIT_COMMAND
unset TRAJKIT_COMMAND
eval "$__tk_command"
