#!/usr/bin/env bash
# Provision Apptainer on a Debian 12 host, where it is not packaged.
#
# Debian sid's apptainer needs a newer glibc than bookworm has, so it lives in a trixie rootfs made by
# debootstrap and is entered through bubblewrap. Wrappers /usr/local/bin/apptainer and
# /usr/local/bin/singularity hide that: callers run them like the real thing.
#
#   apptainer.sh start    install host packages, bootstrap the rootfs, install the wrappers
#   apptainer.sh images   build test images without any registry (a busybox SIF, the same as a sandbox
#                         directory, and as a docker-archive tar) and print their paths
#   apptainer.sh stop     stop every trajkit-* instance of this user (there is no daemon to stop)
#
# All are idempotent: a rerun only checks that everything is in place. Logs go to stderr.
#
# Host paths inside the wrapper: the rootfs replaces /, so only bound host paths are visible. Bound at
# their own path: /tmp, /dev, /proc, /sys, every top-level host directory that is not part of the
# system (/root, /home, /work, /srv, /mnt, /opt...), the images directory, the caller's working
# directory, and any path listed (colon-separated) in TRAJKIT_APPTAINER_BINDS.
set -euo pipefail

STATE_DIR=${TRAJKIT_APPTAINER_HOME:-/var/lib/trajkit-apptainer}
ROOTFS=$STATE_DIR/rootfs
IMAGES=${TRAJKIT_APPTAINER_IMAGES:-$STATE_DIR/images}
BIN_DIR=${TRAJKIT_APPTAINER_BIN_DIR:-/usr/local/bin}
MIRROR=${TRAJKIT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=trixie
ROOTFS_PACKAGES=(squashfs-tools squashfuse uidmap libseccomp2 e2fsprogs containernetworking-plugins
    ca-certificates)
HOST_PACKAGES=(debootstrap bubblewrap busybox-static)
NET_TIMEOUT=600   # one download step (apt, debootstrap)
LOCK_TIMEOUT=900  # another provisioning run holding the lock

log() { printf '[apptainer.sh] %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

usage() {
    sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

# Serialise provisioning runs: two CI steps or shells starting at once must not debootstrap twice.
take_lock() {
    mkdir -p "$STATE_DIR"
    exec 9>"$STATE_DIR/.provision.lock"
    flock -w "$LOCK_TIMEOUT" 9 || die "another provisioning run holds $STATE_DIR/.provision.lock"
}

# Remove a directory a killed debootstrap may have left with /proc, /sys or /dev mounted inside:
# unmount those first, and never let rm cross into another file system.
remove_tree() {
    local dir=$1 mount_point
    [[ -e $dir ]] || return 0
    while read -r mount_point; do
        umount -l "$mount_point" || true
    done < <(awk -v prefix="$dir/" 'index($2, prefix) == 1 {print $2}' /proc/self/mounts | sort -r)
    rm -rf --one-file-system -- "$dir"
}

# Run a command inside the rootfs as root with the host's network, for package installation.
in_rootfs() {
    local root=$1
    shift
    timeout --kill-after=10 "$NET_TIMEOUT" bwrap --bind "$root" / --dev-bind /dev /dev --proc /proc \
        --bind /sys /sys --ro-bind-try /etc/resolv.conf /etc/resolv.conf --cap-add ALL \
        --die-with-parent -- /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
        DEBIAN_FRONTEND=noninteractive LC_ALL=C "$@"
}

install_host_packages() {
    local missing=() pkg
    for pkg in "${HOST_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
    done
    if ((${#missing[@]} == 0)); then
        log "host packages present"
        return
    fi
    log "installing host packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    timeout "$NET_TIMEOUT" apt-get update -qq >&2
    timeout "$NET_TIMEOUT" apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

# debootstrap + sid's apptainer into $ROOTFS.partial, then one rename: $ROOTFS exists only complete.
bootstrap_rootfs() {
    if [[ -f $ROOTFS/.trajkit-ready ]]; then
        configure_apptainer "$ROOTFS"
        log "rootfs ready at $ROOTFS"
        return
    fi
    local partial=$ROOTFS.partial
    remove_tree "$partial"
    remove_tree "$ROOTFS"
    log "debootstrap $SUITE into $partial (about a minute)"
    timeout --kill-after=10 "$NET_TIMEOUT" debootstrap --variant=minbase "$SUITE" "$partial" "$MIRROR" \
        >"$STATE_DIR/debootstrap.log" 2>&1 </dev/null || {
        tail -n 20 "$STATE_DIR/debootstrap.log" >&2
        die "debootstrap failed (full log: $STATE_DIR/debootstrap.log)"
    }
    cat >"$partial/etc/apt/sources.list" <<EOF
deb $MIRROR $SUITE main
deb $MIRROR sid main
EOF
    # Everything comes from trixie unless asked for by name with /sid.
    printf 'APT::Default-Release "%s";\n' "$SUITE" >"$partial/etc/apt/apt.conf.d/99trajkit-default-release"
    # Mirrors that serve a frozen copy of the archive outlive the Release files' Valid-Until dates;
    # translations are 70 MB of indexes nobody reads here.
    printf 'Acquire::Check-Valid-Until "false";\nAcquire::Languages "none";\n' \
        >"$partial/etc/apt/apt.conf.d/99trajkit-apt"
    # A throwaway rootfs: no fsync per unpacked file.
    printf 'force-unsafe-io\n' >"$partial/etc/dpkg/dpkg.cfg.d/99trajkit-unsafe-io"
    log "installing apptainer (sid) and its helpers in the rootfs"
    local apt_log=$STATE_DIR/rootfs-apt.log
    {
        in_rootfs "$partial" apt-get update -q &&
            in_rootfs "$partial" apt-get install -y -q --no-install-recommends "${ROOTFS_PACKAGES[@]}" \
                apptainer/sid &&
            in_rootfs "$partial" apt-get clean
    } >"$apt_log" 2>&1 || {
        tail -n 20 "$apt_log" >&2
        die "installing apptainer in the rootfs failed (full log: $apt_log)"
    }
    configure_apptainer "$partial"
    touch "$partial/.trajkit-ready"
    mv "$partial" "$ROOTFS"
    log "rootfs ready at $ROOTFS"
}

# Root here lacks CAP_SYS_RESOURCE, so Apptainer's default (grant root every capability) fails.
# No systemd runs here, so resource limits (--memory, --pids-limit) go through cgroupfs directly.
configure_apptainer() {
    set_conf "$1" "root default capabilities" file
    set_conf "$1" "systemd cgroups" no
}

# Set KEY = VALUE in the rootfs's apptainer.conf, replacing the key's line or adding one.
set_conf() {
    local conf=$1/etc/apptainer/apptainer.conf key=$2 value=$3
    [[ -f $conf ]] || die "apptainer.conf missing in the rootfs: did the apptainer package install?"
    if grep -qE "^[[:space:]]*$key[[:space:]]*=" "$conf"; then
        sed -i -E "s/^[[:space:]]*$key[[:space:]]*=.*/$key = $value/" "$conf"
    else
        printf '%s = %s\n' "$key" "$value" >>"$conf"
    fi
}

write_wrapper() {
    local target=$BIN_DIR/apptainer tmp
    mkdir -p "$BIN_DIR"
    tmp=$(mktemp "$BIN_DIR/.apptainer.XXXXXX")
    cat >"$tmp" <<'EOF'
#!/usr/bin/env bash
# Runs Apptainer from a Debian trixie rootfs through bubblewrap (made by scripts/engines/apptainer.sh).
# Host paths visible inside, at their own path: /tmp, /dev, /proc, /sys, the non-system top-level
# directories, the working directory and the colon-separated TRAJKIT_APPTAINER_BINDS.
set -euo pipefail
EOF
    cat >>"$tmp" <<EOF
ROOTFS=$(printf '%q' "$ROOTFS")
IMAGES=$(printf '%q' "$IMAGES")
EOF
    cat >>"$tmp" <<'EOF'
[[ -x $ROOTFS/usr/bin/apptainer ]] || { echo "apptainer rootfs missing: run scripts/engines/apptainer.sh start" >&2; exit 127; }

args=(--bind "$ROOTFS" / --dev-bind /dev /dev --bind /proc /proc --bind /sys /sys --bind /tmp /tmp
    --ro-bind-try /etc/resolv.conf /etc/resolv.conf --ro-bind-try /etc/hosts /etc/hosts
    --cap-add ALL --die-with-parent)
bound=(/tmp)

# Paths that belong to the rootfs's own system: binding the host's over them would break Apptainer.
system_path() {
    case $1 in
    / | /bin | /bin/* | /boot | /boot/* | /dev | /dev/* | /etc | /etc/* | /lib | /lib/* | /lib32* | /lib64* | \
        /libx32* | /proc | /proc/* | /run | /run/* | /sbin | /sbin/* | /sys | /sys/* | /usr | /usr/* | /var | \
        /var/lib | /var/lib/apptainer | /var/lib/apptainer/* | /var/lib/dpkg* | /var/lib/apt* | /var/cache | \
        /var/cache/apt* | /var/run | /var/run/* | /var/log | /var/lock*) return 0 ;;
    esac
    case $1/ in "$ROOTFS"/*) return 0 ;; esac
    return 1
}

bind_same() {
    local path=${1%/} b
    [[ $path == /* && -e $path ]] || return 0
    if system_path "$path"; then return 0; fi
    for b in "${bound[@]}"; do
        case $path/ in "$b"/*) return 0 ;; esac
    done
    args+=(--bind "$path" "$path")
    bound+=("$path")
}

for dir in /*; do
    if [[ -d $dir && ! -L $dir && $dir != /lost+found ]]; then bind_same "$dir"; fi
done
bind_same "$IMAGES"
bind_same "$PWD"
IFS=: read -r -a extra <<<"${TRAJKIT_APPTAINER_BINDS:-}"
for dir in "${extra[@]}"; do
    if [[ -n $dir ]]; then bind_same "$dir"; fi
done

chdir=/
for b in "${bound[@]}"; do
    case $PWD/ in "$b"/*) chdir=$PWD ;; esac
done
exec bwrap "${args[@]}" --chdir "$chdir" -- "/usr/bin/$(basename "$0")" "$@"
EOF
    chmod 755 "$tmp"
    mv "$tmp" "$target"
    ln -sf apptainer "$BIN_DIR/singularity.tmp"
    mv -T "$BIN_DIR/singularity.tmp" "$BIN_DIR/singularity"
    [[ -e $ROOTFS/usr/bin/singularity || -L $ROOTFS/usr/bin/singularity ]] || ln -s apptainer "$ROOTFS/usr/bin/singularity"
    log "wrappers installed: $BIN_DIR/apptainer $BIN_DIR/singularity"
}

check_engine() {
    local version
    version=$(timeout 60 "$BIN_DIR/apptainer" --version) || die "the apptainer wrapper does not run"
    log "ready: $version"
}

cmd_start() {
    [[ $(id -u) == 0 ]] || die "must run as root (installs packages, enters the rootfs with all capabilities)"
    take_lock
    install_host_packages
    bootstrap_rootfs
    write_wrapper
    check_engine
}

# A static busybox with one symlink per applet: a complete, tiny Linux userland made offline.
build_rootfs_dir() {
    local dir=$IMAGES/busybox-rootfs partial applet
    [[ -f $dir/.trajkit-ready ]] && return
    partial=$dir.partial
    rm -rf "$partial" "$dir"
    mkdir -p "$partial"/{bin,etc,root,tmp,proc,sys,dev,work,opt,var/tmp,usr}
    chmod 1777 "$partial/tmp" "$partial/var/tmp"
    cp /bin/busybox "$partial/bin/busybox"
    for applet in $("$partial/bin/busybox" --list); do
        [[ $applet == busybox ]] || ln -s busybox "$partial/bin/$applet"
    done
    ln -s bin "$partial/sbin"
    ln -s ../bin "$partial/usr/bin"
    ln -s ../bin "$partial/usr/sbin"
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' \
        >"$partial/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$partial/etc/group"
    touch "$partial/.trajkit-ready"
    mv "$partial" "$dir"
    log "built $dir"
}

# `apptainer build TARGET SOURCE` into a temporary name, renamed when complete.
apptainer_build() {
    local target=$1 source=$2 tmp
    shift 2
    tmp=$(dirname "$target")/.$(basename "$target").partial
    rm -rf "$tmp"
    timeout --kill-after=10 300 "$BIN_DIR/apptainer" --silent build "$@" "$tmp" "$source" >&2 ||
        die "apptainer build of $target failed"
    rm -rf "$target"
    mv "$tmp" "$target"
    log "built $target"
}

build_images() {
    local stamp=$IMAGES/busybox-rootfs/.trajkit-ready
    [[ -f $IMAGES/busybox.sif && $IMAGES/busybox.sif -nt $stamp ]] ||
        apptainer_build "$IMAGES/busybox.sif" "$IMAGES/busybox-rootfs"
    # A sandbox directory (what `build --sandbox` makes, with its .singularity.d), not a bare rootfs.
    # Its own mtime comes from the image, hence a stamp file beside it.
    if [[ ! -d $IMAGES/busybox-sandbox || ! $IMAGES/.busybox-sandbox.built -nt $IMAGES/busybox.sif ]]; then
        apptainer_build "$IMAGES/busybox-sandbox" "$IMAGES/busybox.sif" --sandbox
        touch "$IMAGES/.busybox-sandbox.built"
    fi
}

# `docker save` layout (manifest.json, config, one layer tar), so a `docker-archive:` reference can be
# tested without Docker or a registry.
build_docker_archive() {
    local tar=$IMAGES/busybox-docker.tar work diff_id config_sha
    [[ -f $tar && $tar -nt $IMAGES/busybox-rootfs/.trajkit-ready ]] && return
    work=$(mktemp -d "$IMAGES/.docker-archive.XXXXXX")
    tar -C "$IMAGES/busybox-rootfs" --exclude=./.trajkit-ready --numeric-owner -cf "$work/layer.tar" .
    diff_id=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
    printf '{"architecture":"amd64","os":"linux","config":{"Cmd":["/bin/sh"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
        "$diff_id" >"$work/config.json"
    config_sha=$(sha256sum "$work/config.json" | cut -d' ' -f1)
    mv "$work/config.json" "$work/$config_sha.json"
    printf '[{"Config":"%s.json","RepoTags":["trajkit/busybox:test"],"Layers":["layer.tar"]}]' \
        "$config_sha" >"$work/manifest.json"
    tar -C "$work" -cf "$work/archive.tar" manifest.json "$config_sha.json" layer.tar
    mv "$work/archive.tar" "$tar"
    rm -rf "$work"
    log "built $tar"
}

cmd_images() {
    [[ -x $BIN_DIR/apptainer ]] || die "no apptainer wrapper in $BIN_DIR: run '$0 start' first"
    take_lock
    mkdir -p "$IMAGES"
    build_rootfs_dir
    build_images
    build_docker_archive
    printf '%s\n' "$IMAGES/busybox.sif" "$IMAGES/busybox-sandbox" "$IMAGES/busybox-docker.tar"
}

cmd_stop() {
    [[ -x $BIN_DIR/apptainer ]] || return 0
    if timeout 60 "$BIN_DIR/apptainer" instance list 'trajkit-*' 2>/dev/null | grep -q '^trajkit-'; then
        timeout 120 "$BIN_DIR/apptainer" instance stop --force 'trajkit-*' >&2
    fi
    log "no trajkit instance running"
}

case ${1:-} in
start) cmd_start ;;
images) cmd_images ;;
stop) cmd_stop ;;
*) usage ;;
esac
