# search_files, run by /bin/sh inside the sandbox. Set before this: TARGET MODE PATH GLOB PATTERN
# CONTEXT as $1..$6 (each one argument, whatever it holds).
#
# Only regular files are listed (find -type f, which follows no symlink): a FIFO, a device or a
# link met on the way is never opened. PATH was checked by the runner as the file tools check a
# path. Output, for the runner to page through:
#   TARGET files:   the names of the files whose name matches the glob PATTERN, NUL-terminated;
#   TARGET content: grep's lines for the files (whose name matches GLOB, if set) holding a match of
#                   the extended regular expression PATTERN, as FILE NUL LINE:TEXT (a match) or
#                   FILE NUL LINE-TEXT (context, CONTEXT lines either side).
target=$1 path=$3 glob=$4 pattern=$5 context=$6

regular_files() {
    if [ -n "$1" ]; then
        find "$path" -type f -name "$1" -print0
    else
        find "$path" -type f -print0
    fi
}

if [ "$target" = files ]; then
    regular_files "$pattern"
    exit 0
fi
if printf '' | grep -Z -q x 2>/dev/null; [ $? -eq 1 ]; then
    # GNU grep: -Z ends each file name with a NUL, -I skips binary files unread.
    regular_files "$glob" | xargs -0 -r grep -Z -n -H -I -E -C "$context" -e "$pattern" --
else
    # A grep without -Z (BusyBox): one file at a time, its name put before each line.
    regular_files "$glob" | xargs -0 -r sh -c '
        for file do
            grep -n -E -C "$0" -e "$1" -- "$file" 2>/dev/null | while IFS= read -r line; do
                printf "%s\000%s\n" "$file" "$line"
            done
        done' "$context" "$pattern"
fi
exit 0
