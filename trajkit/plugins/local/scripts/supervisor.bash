# The supervisor of one local sandbox: PID 1 of its namespaces, started once, starting every
# command of the sandbox as a job of its own. Run as `bash -c 'eval "$TRAJKIT_SUPERVISOR"' bash
# CONTROL SHELL` with this text in that variable, joined into one line (trajkit/sandbox/shell.py: a short
# command line in `ps`, and a command's error messages read as those of `bash -c`, line 1 first):
# the control directory is $1, the shell for commands $2 (empty: this bash runs them itself,
# without a new program).
#
# Requests arrive on stdin as NUL-terminated fields:
#   x ID MODE   start job ID, as $1/ID.x says (NUL-terminated: CWD N ENV1 .. ENVN COMMAND), in
#               MODE f (foreground: stdin /dev/null, stdout to $1/ID.o, stderr to $1/ID.e) or b
#               (background: stdin from $1/ID.i, stdout and stderr to $1/ID.o). The job reads the
#               file: bash reads a pipe a byte at a time, a file a block at a time.
#   k ID        kill job ID and everything it started
# Reports go to stdout, one line each: "R" once ready, "E ID STATUS" when job ID has ended and
# everything it started is dead (STATUS 137 for a killed job).
#
# A job is a subshell that leads a process group of its own (job control is on here, and off in
# the job) and carries TRAJKIT_PROCESS=ID in its environment, which its descendants inherit. It
# runs the command in a second subshell (`eval`: no program is loaded for a builtin), waits for it,
# kills whatever is left of its group and whatever still carries its mark (a process that left the
# group with setsid), then reports.
# Only the job's own blocking `wait` decides when it ended: no signal trap is involved. The kernel
# delivers no signal from inside the namespace to its PID 1 unless PID 1 handles it, so nothing a
# command runs can stop the supervisor; when the supervisor ends (its stdin closed), the kernel
# kills the namespace.

unset TRAJKIT_SUPERVISOR
set -m
trap '' INT TERM HUP QUIT PIPE USR1 USR2 ALRM TSTP TTIN TTOU
__tk_ctl=$1
__tk_shell=$2
declare -A __tk_jobs=()

__tk_leftovers() {
    # Kill every process but this one in process group $1 or carrying mark $2, until none is left.
    # Every job lives in the supervisor's session (1): only a process that left it (setsid) can
    # have left its job's group too, so only such a process needs its environment read.
    local proc pid entry stat found round=0
    local -a environ
    while ((round < 8)); do
        found=
        for proc in /proc/[0-9]*; do
            pid=${proc#/proc/}
            [[ $pid == 1 || $pid == "$BASHPID" ]] && continue
            read -r stat 2>/dev/null <"$proc/stat" || continue
            # state ppid pgrp session ...
            stat=${stat##*) }
            [[ $stat == Z* ]] && continue
            stat=${stat#* }
            stat=${stat#* }
            if [[ ${stat%% *} == "$1" ]]; then
                kill -9 "$pid" 2>/dev/null
                found=1
                continue
            fi
            stat=${stat#* }
            [[ ${stat%% *} == 1 ]] && continue
            mapfile -t -d '' environ 2>/dev/null <"$proc/environ" || continue
            for entry in "${environ[@]}"; do
                if [[ $entry == "TRAJKIT_PROCESS=$2" ]]; then
                    kill -9 "$pid" 2>/dev/null
                    found=1
                    break
                fi
            done
        done
        [[ -n $found ]] || return 0
        round=$((round + 1))
    done
}

printf 'R\n'
exec 2>/dev/null
while IFS= read -r -d '' __tk_kind && IFS= read -r -d '' __tk_id; do
    case $__tk_kind in
    x)
        IFS= read -r -d '' __tk_mode || break
        # The job's leader. It is no function: a command's error messages then read as bash -c's.
        (
            trap - INT TERM HUP QUIT PIPE USR1 USR2 ALRM TSTP TTIN TTOU
            exec 9>&1
            {
                IFS= read -r -d '' __tk_cwd && IFS= read -r -d '' __tk_count || exit 1
                __tk_env=()
                while ((${#__tk_env[@]} < __tk_count)); do
                    IFS= read -r -d '' __tk_entry || exit 1
                    __tk_env+=("$__tk_entry")
                done
                IFS= read -r -d '' __tk_command
            } <"$__tk_ctl/$__tk_id.x"
            if [[ $__tk_mode == b ]]; then
                exec <"$__tk_ctl/$__tk_id.i" >"$__tk_ctl/$__tk_id.o" 2>&1
            else
                exec </dev/null >"$__tk_ctl/$__tk_id.o" 2>"$__tk_ctl/$__tk_id.e"
            fi
            export TRAJKIT_PROCESS=$__tk_id
            (
                exec 9>&-
                for __tk_entry in "${__tk_env[@]}"; do
                    export "$__tk_entry"
                done
                cd -- "$__tk_cwd" || exit 1
                if [[ -n $__tk_shell ]]; then
                    exec "$__tk_shell" -c "$__tk_command"
                fi
                unset -f __tk_leftovers
                unset __tk_ctl __tk_jobs __tk_env __tk_entry __tk_kind __tk_id __tk_mode __tk_cwd \
                    __tk_count __tk_shell __tk_pid
                set --
                eval "unset __tk_command; $__tk_command"
            ) <&0 &
            wait "$!"
            __tk_status=$?
            exec 0</dev/null 1>/dev/null 2>/dev/null
            __tk_leftovers "$BASHPID" "$__tk_id"
            printf 'E %s %s\n' "$__tk_id" "$__tk_status" >&9
            exit 0
        ) &
        __tk_jobs[$__tk_id]=$!
        disown
        ;;
    k)
        __tk_pid=${__tk_jobs[$__tk_id]}
        if [[ -n $__tk_pid ]]; then
            unset "__tk_jobs[$__tk_id]"
            kill -9 -- "-$__tk_pid" 2>/dev/null
            __tk_leftovers "$__tk_pid" "$__tk_id"
            printf 'E %s 137\n' "$__tk_id"
        fi
        ;;
    esac
    if ((${#__tk_jobs[@]} > 64)); then
        for __tk_id in "${!__tk_jobs[@]}"; do
            kill -0 "${__tk_jobs[$__tk_id]}" 2>/dev/null || unset "__tk_jobs[$__tk_id]"
        done
    fi
done
