# Run once per image, as the commands' user: the tools the backend needs that the image lacks, the
# user's numeric ids and whether its home is writable. Arguments: the tools to look for.
for t in "$@"; do command -v "$t" >/dev/null 2>&1 || echo "missing $t"; done
echo "uid $(id -u 2>/dev/null)"
echo "gid $(id -g 2>/dev/null)"
if [ -n "$HOME" ] && [ "$HOME" != / ] && [ -d "$HOME" ] && [ -w "$HOME" ]; then echo home; fi
