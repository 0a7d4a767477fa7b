# Run once per image, as root with the enter program's capabilities: prints "KIND TOOL NAME DROP" for
# the first way the image has to become user 65534 (util-linux setpriv, else su), tried for real, or
# "none". Tools are looked for in the system's directories only, never on a PATH.
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
