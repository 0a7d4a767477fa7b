# Runs inside a session's sandbox, started through its backend's bridge: $1 is the browser, the
# rest Playwright's arguments. The DevTools pipe arrives as standard input (commands) and output
# (replies) and becomes the file descriptors 3 and 4 the browser expects with
# --remote-debugging-pipe; the browser's own output goes to standard error. Its home and profile
# are a fresh directory of its own, which its user alone may enter (the profile directory
# Playwright names is a path of the runner's; the last --user-data-dir is the one that counts).
browser=$1
shift
home=$(mktemp -d /tmp/trajkit-browser.XXXXXX) || exit 1
export HOME="$home"
cd "$home" || exit 1
exec "$browser" "$@" --user-data-dir="$home/profile" 3<&0 4>&1 0</dev/null 1>&2
