#!/usr/bin/env bash
# Run a private Docker daemon and build trajkit's test images, with no systemd and no image registry.
#
#   bash scripts/engines/docker.sh start    # install docker.io if needed, start dockerd (idempotent)
#   bash scripts/engines/docker.sh images   # build trajkit-test/busybox, /python and /chromium locally
#   bash scripts/engines/docker.sh stop     # stop the daemon started by `start`
#
# The daemon runs without iptables and without a bridge: containers get loopback only unless they
# ask for the host network, which is all the sandbox backend needs and all this machine allows.
# It listens on the default socket so `docker` and `docker.from_env()` find it without DOCKER_HOST.
set -euo pipefail

STATE_DIR=${TRAJKIT_DOCKER_STATE:-/var/lib/trajkit-docker}
EXEC_ROOT=${TRAJKIT_DOCKER_EXEC_ROOT:-/run/trajkit-docker}
CACHE_DIR=${TRAJKIT_CACHE_DIR:-/var/cache/trajkit}
SOCKET=${TRAJKIT_DOCKER_SOCKET:-/var/run/docker.sock}
DEBIAN_MIRROR=${TRAJKIT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${TRAJKIT_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
PIDFILE="$STATE_DIR/dockerd.pid"
LOGFILE="$STATE_DIR/dockerd.log"
READY_TIMEOUT=${TRAJKIT_DOCKER_READY_TIMEOUT:-60}

BUSYBOX_IMAGE=trajkit-test/busybox:latest
PYTHON_IMAGE=trajkit-test/python:latest
PYTHON_ROOTFS="$CACHE_DIR/python-bookworm-minbase.tar"
CHROMIUM_IMAGE=trajkit-test/chromium:latest
CHROMIUM_SAVED="$CACHE_DIR/chromium-bookworm.tar"
BUILD_CONTAINER=""

APT_UPDATED=0
SCRATCH=""

cleanup() {
    if [ -n "$SCRATCH" ]; then rm -rf "$SCRATCH"; fi
    if [ -n "$BUILD_CONTAINER" ]; then docker_cli rm -f "$BUILD_CONTAINER" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

# A fresh scratch directory, removed when the script exits however it exits.
scratch_dir() {
    cleanup
    SCRATCH=$(mktemp -d)
}

log() { echo "[docker.sh] $*" >&2; }
die() {
    log "error: $*"
    exit 1
}

docker_cli() { docker --host "unix://$SOCKET" "$@"; }

# Install missing Debian packages. `apt-get update` runs at most once per invocation: before the
# install when the package lists are missing, else only if an install from the present lists fails.
apt_install() {
    local missing=()
    local pkg
    for pkg in "$@"; do
        [ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)" = "install ok installed" ] ||
            missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(id -u)" -eq 0 ] || die "installing ${missing[*]} needs root"
    if ! compgen -G "/var/lib/apt/lists/*_Packages*" >/dev/null; then
        apt_update
    fi
    log "apt-get install ${missing[*]}"
    apt_get_install "${missing[@]}" && return 0
    [ "$APT_UPDATED" -eq 0 ] || die "apt-get install ${missing[*]} failed"
    apt_update
    apt_get_install "${missing[@]}" || die "apt-get install ${missing[*]} failed"
}

apt_update() {
    log "apt-get update"
    apt-get update -qq >&2
    APT_UPDATED=1
}

apt_get_install() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2
}

daemon_answers() { docker_cli info >/dev/null 2>&1; }

daemon_pid() {
    [ -s "$PIDFILE" ] || return 1
    local pid
    pid=$(cat "$PIDFILE")
    kill -0 "$pid" 2>/dev/null || return 1
    echo "$pid"
}

# Start dockerd with one storage driver; succeed once `docker info` answers, fail if it dies or stalls.
launch_dockerd() {
    local driver=$1
    mkdir -p "$STATE_DIR/data" "$EXEC_ROOT"
    rm -f "$PIDFILE"
    if [ -f "$LOGFILE" ] && [ "$(stat -c %s "$LOGFILE")" -gt $((10 * 1024 * 1024)) ]; then
        mv -f "$LOGFILE" "$LOGFILE.old"
    fi
    log "starting dockerd (storage driver $driver, log $LOGFILE)"
    setsid dockerd \
        --iptables=false --ip6tables=false --bridge=none \
        --storage-driver="$driver" \
        --data-root="$STATE_DIR/data" --exec-root="$EXEC_ROOT" \
        --pidfile="$PIDFILE" --host="unix://$SOCKET" \
        >>"$LOGFILE" 2>&1 </dev/null &
    local pid=$!
    local waited=0
    while [ "$waited" -lt $((READY_TIMEOUT * 4)) ]; do
        if daemon_answers; then
            log "dockerd ready (pid $pid)"
            return 0
        fi
        if ! kill -0 "$pid" 2>/dev/null; then
            log "dockerd exited during startup; last log lines:"
            tail -n 5 "$LOGFILE" >&2 || true
            return 1
        fi
        sleep 0.25
        waited=$((waited + 1))
    done
    log "dockerd did not answer within ${READY_TIMEOUT}s; stopping it"
    kill "$pid" 2>/dev/null || true
    wait_gone "$pid" 20 || kill -9 "$pid" 2>/dev/null || true
    return 1
}

wait_gone() {
    local pid=$1 seconds=$2 i=0
    while kill -0 "$pid" 2>/dev/null; do
        [ "$i" -ge $((seconds * 4)) ] && return 1
        sleep 0.25
        i=$((i + 1))
    done
}

cmd_start() {
    if daemon_answers; then
        log "a docker daemon already answers on $SOCKET; nothing to do"
        return 0
    fi
    command -v dockerd >/dev/null 2>&1 || apt_install docker.io
    command -v docker >/dev/null 2>&1 || die "docker client missing after installing docker.io"
    mkdir -p "$STATE_DIR"
    if pid=$(daemon_pid); then
        log "dockerd (pid $pid) is running but does not answer; stopping it first"
        cmd_stop
    fi
    launch_dockerd overlay2 || {
        log "overlay2 failed; falling back to the vfs storage driver"
        launch_dockerd vfs
    } || die "dockerd would not start; see $LOGFILE"
}

cmd_stop() {
    local pid
    if ! pid=$(daemon_pid); then
        log "no dockerd running from $PIDFILE"
        return 0
    fi
    log "stopping dockerd (pid $pid)"
    kill "$pid"
    if ! wait_gone "$pid" 30; then
        log "dockerd still alive after 30s; killing it"
        kill -9 "$pid" 2>/dev/null || true
        wait_gone "$pid" 10 || die "dockerd (pid $pid) would not die"
    fi
    rm -f "$PIDFILE"
    log "dockerd stopped"
}

image_exists() { docker_cli image inspect "$1" >/dev/null 2>&1; }

# A busybox-static rootfs: one static binary plus a symlink per applet, a few directories and users.
build_busybox() {
    if image_exists "$BUSYBOX_IMAGE"; then
        log "$BUSYBOX_IMAGE exists; skipping"
        return 0
    fi
    apt_install busybox-static
    scratch_dir
    local root=$SCRATCH
    mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,etc,tmp,root,work,proc,sys,dev}
    chmod 1777 "$root/tmp"
    cp /bin/busybox "$root/bin/busybox"
    local applet
    for applet in $("$root/bin/busybox" --list-full); do
        [ "$applet" = bin/busybox ] && continue
        mkdir -p "$root/$(dirname "$applet")"
        ln -sf /bin/busybox "$root/$applet"
    done
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$root/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
    log "importing $BUSYBOX_IMAGE"
    tar --numeric-owner -C "$root" -c . |
        docker_cli import --change 'CMD ["/bin/sh"]' --change 'ENV PATH=/usr/sbin:/usr/bin:/sbin:/bin' \
            - "$BUSYBOX_IMAGE" >/dev/null
}

# A minimal Debian with python3; the rootfs tarball is cached so a rebuild skips debootstrap.
build_python() {
    if image_exists "$PYTHON_IMAGE"; then
        log "$PYTHON_IMAGE exists; skipping"
        return 0
    fi
    if [ ! -s "$PYTHON_ROOTFS" ]; then
        apt_install debootstrap
        mkdir -p "$CACHE_DIR"
        scratch_dir
        local root=$SCRATCH
        log "debootstrap minbase bookworm with python3-minimal (about 30 s)"
        debootstrap --variant=minbase --include=python3-minimal bookworm "$root" "$DEBIAN_MIRROR" >&2
        rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
        mkdir -p "$root/work"
        tar --numeric-owner -C "$root" -cf "$PYTHON_ROOTFS.partial" .
        mv "$PYTHON_ROOTFS.partial" "$PYTHON_ROOTFS"
    else
        log "using cached rootfs $PYTHON_ROOTFS"
    fi
    log "importing $PYTHON_IMAGE"
    docker_cli import --change 'CMD ["/bin/sh"]' \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        "$PYTHON_ROOTFS" "$PYTHON_IMAGE" >/dev/null
}

# The python image plus Python's standard library (a test's web app: python3 -m http.server) and
# Debian's chromium (the browser toolset's in-container browser), without recommends, documentation,
# translations, icons, or Mesa's drivers and their LLVM (headless Chromium draws with its own
# SwiftShader). Built in a container on the host network
# (the only network this daemon gives), then saved to the cache so a rebuild only loads it.
build_chromium() {
    if image_exists "$CHROMIUM_IMAGE"; then
        log "$CHROMIUM_IMAGE exists; skipping"
        return 0
    fi
    if [ -s "$CHROMIUM_SAVED" ]; then
        log "loading cached $CHROMIUM_SAVED"
        docker_cli load -i "$CHROMIUM_SAVED" >/dev/null
        return 0
    fi
    BUILD_CONTAINER=trajkit-build-chromium-$$
    log "installing chromium into $PYTHON_IMAGE (about 2 min)"
    docker_cli run --name "$BUILD_CONTAINER" --network host "$PYTHON_IMAGE" /bin/sh -c "
        set -e
        printf 'deb %s bookworm main\\ndeb %s bookworm-security main\\n' '$DEBIAN_MIRROR' '$SECURITY_MIRROR' \\
            > /etc/apt/sources.list
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \\
            chromium libpython3.11-stdlib >/dev/null
        apt-get clean
        rm -rf /var/lib/apt/lists/* /usr/share/doc/* /usr/share/man/* /usr/share/info/* \\
            /usr/share/locale/* /usr/share/icons/* /usr/lib/x86_64-linux-gnu/dri \\
            /usr/lib/x86_64-linux-gnu/libLLVM-* /usr/lib/x86_64-linux-gnu/libz3.* \\
            /usr/lib/chromium/libVkLayer_khronos_validation.so
        find /usr/lib/chromium/locales -name '*.pak' ! -name en-US.pak -delete
        /usr/lib/chromium/chromium --version
        python3 -c 'import http.server'
    " >&2
    docker_cli commit --change 'CMD ["/bin/sh"]' "$BUILD_CONTAINER" "$CHROMIUM_IMAGE" >/dev/null
    docker_cli rm -f "$BUILD_CONTAINER" >/dev/null
    BUILD_CONTAINER=""
    mkdir -p "$CACHE_DIR"
    docker_cli save -o "$CHROMIUM_SAVED.partial" "$CHROMIUM_IMAGE"
    mv "$CHROMIUM_SAVED.partial" "$CHROMIUM_SAVED"
}

cmd_images() {
    daemon_answers || die "no docker daemon answers on $SOCKET; run '$0 start' first"
    build_busybox
    build_python
    build_chromium
    log "images ready: $BUSYBOX_IMAGE $PYTHON_IMAGE $CHROMIUM_IMAGE"
}

main() {
    case "${1:-}" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    images) cmd_images ;;
    *)
        echo "usage: $0 {start|stop|images}" >&2
        exit 2
        ;;
    esac
}

main "$@"
