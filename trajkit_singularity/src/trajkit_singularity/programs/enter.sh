# argv: TOOL KIND UID GID USER DROP COMMAND... Run as root with CAP_SETUID and CAP_SETGID only (and
# no_new_privs): becomes UID:GID with no capability left, through the image's setpriv or su (TOOL, an
# absolute path), and runs COMMAND. su keeps the two capabilities inheritable; DROP, a setpriv
# (BusyBox's will do) or -, clears them first. HOME is /tmp (the user's own is /nonexistent or /); a
# row's environment, applied by the launcher, may say otherwise.
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
