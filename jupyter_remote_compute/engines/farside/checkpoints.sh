#!/bin/sh
# checkpoints.sh DIR FOLDER: the files of the job's checkpoint folder (DIR/work/FOLDER), one a line:
#   <size> <mtime in ns> <base64 of the path under FOLDER>
# Names a writer uses while a file is not yet whole are left out: a name or folder starting with '.',
# and names ending in .tmp, .part, .partial or ~ (torch.save to "x.tmp" then a rename into place is
# taken only once renamed). Whether a listed file is complete is this side's call (jobs/checkpoints.py:
# unchanged between two looks). Links are not followed, nor listed. A folder not made yet lists empty.
cd -- "$1/work" 2>/dev/null || { echo "job directory $1 is missing" >&2; exit 3; }
[ -d "$2" ] || exit 0
prog='
import base64, os, stat, sys
root = sys.argv[1]
def temporary(name):
    return name.startswith(".") or name.endswith((".tmp", ".part", ".partial", "~"))
for dirpath, dirs, files in os.walk(root):
    dirs[:] = [d for d in dirs if not temporary(d)]
    for name in files:
        if temporary(name):
            continue
        p = os.path.join(dirpath, name)
        try:
            st = os.lstat(p)
        except OSError:
            continue  # renamed away between the listing and the look
        if stat.S_ISREG(st.st_mode):
            rel = os.path.relpath(p, root)
            sys.stdout.write("%d %d %s\n" % (st.st_size, st.st_mtime_ns, base64.b64encode(os.fsencode(rel)).decode()))
'
if command -v python3 >/dev/null 2>&1; then
  exec python3 -S -E -c "$prog" "$2"
fi
# Without python3: coreutils' stat, whole seconds only.
root=$2
find "$root" -mindepth 1 \( -name '.*' -o -name '*.tmp' -o -name '*.part' -o -name '*.partial' -o -name '*~' \) -prune \
  -o -type f -print |
  while IFS= read -r p; do
    sm=$(stat -c '%s %Y' -- "$p") || continue
    printf '%s000000000 %s\n' "$sm" "$(printf '%s' "${p#"$root"/}" | base64 | tr -d '\n')"
  done
