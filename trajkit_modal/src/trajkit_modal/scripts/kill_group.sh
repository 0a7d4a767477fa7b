# Sent as a second exec after a timeout ($1: the exec's id): Modal has stopped waiting, but the
# processes may live on.
f=${TMPDIR:-/tmp}/.trajkit-exec-$1
if [ -r "$f" ]; then
  read -r w p <"$f"
  kill -9 -"$p" "$w" 2>/dev/null
  rm -f "$f"
fi
exit 0
