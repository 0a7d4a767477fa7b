#!/usr/bin/env bash
# Install Debian's headless-capable Chromium (plus its driver and a font): the browser the `browser`
# toolset drives through Playwright, and the one the browser tests of `trajkit report` use.
# Idempotent: packages already installed are left alone and no network is used.
#
#   bash scripts/install-chromium.sh
#
# Prints the browser's path and version when done. Chromium comes from Debian's own packages, so
# the tests never depend on a browser build downloaded by a test tool.
set -euo pipefail

PACKAGES=(chromium chromium-driver fonts-dejavu-core)

log() { echo "[install-chromium.sh] $*" >&2; }
die() {
    log "error: $*"
    exit 1
}

missing=()
for pkg in "${PACKAGES[@]}"; do
    [ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)" = "install ok installed" ] ||
        missing+=("$pkg")
done

if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" -eq 0 ] || die "installing ${missing[*]} needs root"
    log "apt-get update"
    apt-get update -qq >&2
    log "apt-get install ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

browser=$(command -v chromium) || die "chromium is not on PATH after installing it"
log "$browser: $("$browser" --version 2>/dev/null || echo 'version unknown')"
