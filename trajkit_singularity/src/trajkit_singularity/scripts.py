"""Shell programs run inside an instance, and the host-side watchdog.

The in-container programs are written once into a content-addressed host directory and bound
read-only into every instance at :data:`MOUNT`, so a ``ps`` inside shows ``/bin/sh /.trajkit/launch
COMMAND`` rather than pages of script. Every value (the command, a path, a marker) reaches them as an
argv element, never spliced into script text, so no quoting of untrusted strings is ever needed. They
use only POSIX sh and what BusyBox has (grep, kill, cat, mkdir), so any image with a shell runs them.

How an exec's processes are found again: the launcher starts with ``TRAJKIT_EXEC_ID=<random marker>``
in its environment and runs the command under ``setsid``. Every descendant inherits the marker in its
initial environment (``/proc/PID/environ``), and the command leads its own session. The sweep kills whatever
carries the marker and whatever sits in a session one of them leads, so a child that clears its
environment is still found, and so is one that starts its own session; and it kills every orphan (a
process descending from the instance's init rather than from an exec), so one that does both is
found too. Instances therefore run no service of their own beside the execs.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trajkit_singularity.users import Switch

MOUNT = "/.trajkit"
MARKER_VARIABLE = "TRAJKIT_EXEC_ID"

# sweep MARKER: SIGKILL every process of the exec tagged MARKER, every process in a session one of
# them leads, and every orphan, except the calling shell and the instance's init (PID 1). An orphan is
# a process whose oldest ancestor in the instance is that init: a daemon that cleared its environment
# (`env -i setsid daemon &`) is reparented there when its shell exits, whereas every exec has a parent
# outside the instance's PID namespace (parent pid 0), so concurrent execs are left alone. Victims are
# stopped first and killed together, so none sees another die (no shell reports "Killed"); repeated
# because a process may fork between listing and kill. The sweep returns once its victims are reaped
# (by the instance's init, five seconds at most): a killed process holds a slot of the instance's
# process limit until it has exited and been reaped, so an exec that returned sooner could leave the
# next one unable to start (Apptainer's own starter needs a dozen).
#
# reaped SECONDS PID...: waits until none of the PIDs exists any more, or SECONDS have passed. The
# clock is /proc/uptime, read by the shell itself: right after a kill the limit is often still full,
# so `sleep` cannot start, and a wait counted in `sleep`s would end at once with its victims alive.
_SWEEP = r"""
uptime_centis() {
    read -r up _ 2>/dev/null </proc/uptime || return 1
    case $up in *[!0-9.]* | *.*.* | .* | *.) return 1 ;; esac
    now=$(( ${up%.*} * 100 + 1${up#*.} - 100 ))
}

reaped() {
    uptime_centis || return 0
    deadline=$(( now + $1 * 100 ))
    shift
    for pid in "$@"; do
        while [ -e "/proc/$pid" ]; do
            uptime_centis && [ "$now" -lt "$deadline" ] || return 0
            sleep 0.01 2>/dev/null
        done
    done
}

orphan() {
    at=$1 top=
    while [ -n "$at" ] && [ "$at" != 0 ]; do
        read -r st 2>/dev/null <"/proc/$at/stat" || return 1
        set -- ${st##*) }
        top=$at at=$2
    done
    [ "$top" = 1 ]
}

sweep() {
    marker=$1 self=$$ round=0 sessions=" " killed=
    while [ "$round" -lt 6 ]; do
        victims=
        for p in /proc/[0-9]*; do
            pid=${p#/proc/}
            [ "$pid" = "$self" ] || [ "$pid" = 1 ] && continue
            read -r stat 2>/dev/null <"$p/stat" || continue
            set -- ${stat##*) }
            [ "$1" = Z ] && continue
            case $sessions in
            *" $4 "*) ;;
            *)
                grep -q "TRAJKIT_EXEC_ID=$marker" "$p/environ" 2>/dev/null || orphan "$pid" || continue
                [ "$4" = "$pid" ] && sessions="$sessions$pid "
                ;;
            esac
            kill -STOP "$pid" 2>/dev/null && victims="$victims $pid"
        done
        [ -n "$victims" ] || break
        kill -9 $victims 2>/dev/null
        killed="$killed$victims"
        round=$((round + 1))
    done
    reaped 5 $killed
}
"""

LAUNCHER = (
    _SWEEP
    + r"""
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
"""
)
"""argv: COMMAND [NAME=VALUE...], environment: TRAJKIT_EXEC_ID=MARKER. Runs COMMAND, then kills
whatever it left running.

The marker comes through the environment (``APPTAINERENV_TRAJKIT_EXEC_ID`` on the client) so that this
shell carries it too and a timeout's sweep stops it with the rest, before it can report its child's
death.

The command runs in the foreground (a background job would start with SIGINT ignored), and ``setsid``
does not fork there because the child of this shell never leads a process group.
"""

KILLER = _SWEEP + '\nsweep "$1"\n'
"""argv: MARKER. Run from a second exec when an exec times out."""

READER = r"""
[ -d "$1" ] && exit 21
[ -e "$1" ] || exit 2
[ -f "$1" ] || exit 22
size=$(stat -L -c %s -- "$1" 2>/dev/null) || size=$(wc -c <"$1") || exit 1
echo "$size"
if [ "$size" -le "$2" ]; then exec head -c "$(($2 + 1))" -- "$1"; fi
head -c "$(($2 / 2))" -- "$1" && exec tail -c "$(($2 - $2 / 2))" -- "$1"
"""
"""argv: PATH LIMIT. Prints the regular file's size on a line, then the file, or only its first and
last LIMIT/2 bytes when it is larger than LIMIT (at most LIMIT + 1 bytes even if it grows meanwhile).
Exit 2 when missing, 21 when a directory, 22 when a device, FIFO or socket (which is never opened)."""

WRITER = r"""
dir=${1%/*}
[ -n "$dir" ] && { mkdir -p -- "$dir" || exit 1; }
[ -d "$1" ] && exit 21
[ -e "$1" ] && [ ! -f "$1" ] && exit 22
exec cat >"$1"
"""
"""argv: PATH. Writes stdin to PATH, creating parent directories; exit 21 when PATH is a directory,
22 when it is a device, FIFO or socket."""

READER_MISSING = 2
READER_IS_DIRECTORY = 21
READER_NOT_REGULAR = 22

WATCHDOG = 'sleep "$1"; "$2" instance stop --force "$3"; rm -rf -- "$4"'
"""Host side, argv: SECONDS BINARY INSTANCE DIRECTORY. Stops the instance and removes its directory
once the sandbox's lifetime is over, whether or not trajkit still runs."""


ENTER = r"""
tool=$1 kind=$2 uid=$3 gid=$4 user=$5 drop=$6
shift 6
export HOME=/tmp
case $kind in
setpriv) exec "$tool" --reuid="$uid" --regid="$gid" --clear-groups --inh-caps=-all --bounding-set=-all -- "$@" ;;
su)
    [ "$drop" = - ] && exec "$tool" -p -s /bin/sh -c 'exec "$0" "$@"' "$user" -- "$@"
    exec "$drop" --inh-caps=-setuid,-setgid "$tool" -p -s /bin/sh -c 'exec "$0" "$@"' "$user" -- "$@" ;;
esac
exit 125
"""
"""argv: TOOL KIND UID GID USER DROP COMMAND... Run as root with CAP_SETUID and CAP_SETGID only (and
``no_new_privs``): becomes UID:GID with no capability left, through the image's ``setpriv`` or
``su`` (TOOL, an absolute path), and runs COMMAND. ``su`` keeps the two capabilities inheritable;
DROP, a ``setpriv`` (BusyBox's will do) or ``-``, clears them first. ``HOME`` is ``/tmp`` (the
user's own is ``/nonexistent`` or ``/``); a row's environment, applied by the launcher, may say
otherwise."""

PROBE = r"""
id=65534
is_user='[ "$(id -u)" = 65534 ]'
where() {
    for dir in /usr/local/sbin /usr/local/bin /usr/sbin /usr/bin /sbin /bin; do
        if [ -x "$dir/$1" ]; then echo "$dir/$1"; return 0; fi
    done
    return 1
}
if tool=$(where setpriv) && "$tool" --reuid=$id --regid=$id --clear-groups --inh-caps=-all --bounding-set=-all -- /bin/sh -c "$is_user" </dev/null >/dev/null 2>&1; then
    echo "setpriv $tool - -"
    exit 0
fi
drop=-
if setpriv=$(where setpriv) && "$setpriv" --inh-caps=-setuid,-setgid true </dev/null >/dev/null 2>&1; then drop=$setpriv; fi
name=$(sed -n "s/^\([^:]*\):[^:]*:$id:.*/\1/p" /etc/passwd 2>/dev/null | head -n 1)
if [ -n "$name" ] && tool=$(where su) && "$tool" -p -s /bin/sh "$name" -c "$is_user" </dev/null >/dev/null 2>&1; then
    echo "su $tool $name $drop"
    exit 0
fi
echo none
"""
"""Run once per image, as root with the ENTER program's capabilities: prints ``KIND TOOL NAME DROP`` for
the first way the image has to become user 65534 (util-linux ``setpriv``, else ``su``), tried for
real, or ``none``. Tools are looked for in the system's directories only, never on a PATH."""

# Denied to every process of an instance when trajkit runs as root: making namespaces (a user
# namespace gives back, inside it, every capability the sandbox dropped; the rest need one) and
# entering another's. clone3 takes its flags in memory that a filter cannot read, so it stays
# allowed: glibc starts threads with it, and Apptainer's own runtime inside the container too.
CLONE_NEWUSER = 0x10000000
SECCOMP_PROFILE = json.dumps(
    {
        "defaultAction": "SCMP_ACT_ALLOW",
        "syscalls": [
            {"names": ["unshare", "setns"], "action": "SCMP_ACT_ERRNO"},
            {
                "names": ["clone"],
                "action": "SCMP_ACT_ERRNO",
                "args": [
                    {
                        "index": 0,
                        "value": CLONE_NEWUSER,
                        "valueTwo": CLONE_NEWUSER,
                        "op": "SCMP_CMP_MASKED_EQ",
                    }
                ],
            },
        ],
    },
    indent=1,
)
SECCOMP_FILE = "seccomp.json"

PROGRAMS = {
    "launch": LAUNCHER,
    "kill": KILLER,
    "read": READER,
    "write": WRITER,
    "enter": ENTER,
    "probe": PROBE,
    SECCOMP_FILE: SECCOMP_PROFILE,
}


def program(name: str, switch: Switch | None = None) -> list[str]:
    """The argv prefix that runs program ``name`` inside an instance, as the sandbox's user: entered
    through ``switch`` (see :mod:`trajkit_singularity.users`), or directly without one."""
    command = ["/bin/sh", f"{MOUNT}/{name}"]
    if switch is None:
        return command
    return ["/bin/sh", f"{MOUNT}/enter", *switch.argv(command)]


def install(cache_dir: Path) -> Path:
    """Write the in-container programs under ``cache_dir`` (once per version) and return their directory.

    Blocking: call it in a worker thread.
    """
    version = hashlib.sha256(repr(sorted(PROGRAMS.items())).encode()).hexdigest()[:12]
    directory = cache_dir / f"programs-{version}"
    if directory.is_dir():
        return directory
    partial = cache_dir / f".programs-{version}.{os.getpid()}.partial"
    partial.mkdir(parents=True, exist_ok=True)
    for name, text in PROGRAMS.items():
        (partial / name).write_text(text.lstrip())
    try:
        partial.rename(directory)
    except OSError:  # another process installed the same version first
        for child in partial.iterdir():
            child.unlink()
        partial.rmdir()
    return directory
