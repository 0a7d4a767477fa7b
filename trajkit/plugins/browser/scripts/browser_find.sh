# Prints the Chromium of a sandbox's image: Debian's program itself (its /usr/bin/chromium is a
# wrapper that reads the image's settings), else the first browser of these names on PATH.
for candidate in /usr/lib/chromium/chromium /usr/lib/chromium-browser/chromium-browser; do
    if [ -x "$candidate" ]; then
        echo "$candidate"
        exit 0
    fi
done
for name in chromium chromium-browser headless_shell google-chrome chrome; do
    if found=$(command -v "$name" 2>/dev/null) && [ -n "$found" ]; then
        echo "$found"
        exit 0
    fi
done
exit 1
