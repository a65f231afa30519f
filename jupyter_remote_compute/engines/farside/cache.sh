#!/bin/sh
# cache.sh OP BASE ...: the input cache of one machine, <BASE>/cache/<sha256>, one read-only file
# per content. A job's inputs are hard links to it (an executable input gets its own copy), so a
# file sent once costs a name, not its bytes, the next time. An entry's atime is its last use: its
# mtime stays when it was made, because a kept set's spare tree (ssh.py send) holds the same inodes
# and is trusted only while none of them is newer than the tree.
#
#   have BASE            digests on stdin up to an empty line -> "<sha256> <size>" for each present
#                        (and marked used)
#   link BASE JOBDIR     "<sha256> <octal mode> <base64 path>" lines on stdin: put each cached
#                        content at JOBDIR/work/<path>; prints "missing <sha256>" for any not cached
#   adopt BASE JOBDIR    "<sha256> <size> <octal mode> <base64 path>" lines: files that arrived in the work tree
#                        become cache entries (linked back); prints "bad <base64 path>" for a file
#                        of the wrong size
#   evict BASE DAYS MAX  drop entries no one links to unused for more than DAYS days, then the least
#                        recently used until the rest (entries no job links to) holds at most MAX bytes;
#                        and kept input sets (BASE/sets/<digest>) unused for DAYS days, all but the newest 8,
#                        and any whose spare has been locked for a day
op=$1
base=$2
KEEP_SETS=8
cache=$base/cache
# A kept set is renamed away before it is deleted, never deleted in place: a send taking its spare
# tree renames it at the same moment, and exactly one of the two renames wins (an rm -rf under way
# would go on deleting inside the job's work tree).
drop_set() { mv -- "$1" "$1.gone.$$" 2>/dev/null && rm -rf -- "$1.gone.$$"; }
case $op in
have)
  mkdir -p -- "$cache" || exit 3
  cd -- "$cache" || exit 3
  # Builtins only while reading (read takes stdin a byte at a time, so nothing after the empty
  # line is consumed); then one touch and one ls for the lot, not two processes per entry, which
  # made the check of a 10,000-file tree take longer than sending it.
  list=.have-$$
  trap 'rm -f -- "$list"' EXIT
  while IFS= read -r sha && [ -n "$sha" ]; do
    case $sha in *[!0-9a-f]*|'') continue ;; esac
    [ -f "$sha" ] && printf '%s\n' "$sha"
  done > "$list"
  [ -s "$list" ] || exit 0
  xargs touch -a -c -- < "$list" 2>/dev/null
  xargs ls -lnd -- < "$list" | awk '$1 ~ /^-/ { print $NF, $5 }'
  ;;
link)
  work=$3/work
  while read -r sha mode b64; do
    [ -n "$sha" ] || continue
    rel=$(printf '%s' "$b64" | base64 -d) || exit 3
    dst=$work/$rel
    mkdir -p -- "$(dirname -- "$dst")" || exit 3
    if [ ! -f "$cache/$sha" ]; then echo "missing $sha"; continue; fi
    rm -f -- "$dst"
    case $mode in
      *[1357]*) cp -- "$cache/$sha" "$dst" && chmod "$mode" -- "$dst" || exit 3 ;;
      *) ln -- "$cache/$sha" "$dst" 2>/dev/null || cp -- "$cache/$sha" "$dst" || exit 3 ;;
    esac
    touch -a -c -- "$cache/$sha" 2>/dev/null
  done
  ;;
adopt)
  work=$3/work
  mkdir -p -- "$cache" || exit 3
  while read -r sha size mode b64; do
    [ -n "$sha" ] || continue
    rel=$(printf '%s' "$b64" | base64 -d) || exit 3
    f=$work/$rel
    if [ ! -f "$f" ]; then echo "bad $b64"; continue; fi
    set -- $(ls -lnd -- "$f")
    if [ "$5" != "$size" ]; then echo "bad $b64"; continue; fi
    case $mode in
      *[1357]*)
        chmod "$mode" -- "$f" || exit 3
        cp -- "$f" "$cache/.$sha.$$" && chmod 0444 -- "$cache/.$sha.$$" && mv -f -- "$cache/.$sha.$$" "$cache/$sha" ;;
      *)
        chmod 0444 -- "$f" || exit 3
        ln -f -- "$f" "$cache/$sha" 2>/dev/null ||
          { cp -- "$f" "$cache/.$sha.$$" && mv -f -- "$cache/.$sha.$$" "$cache/$sha"; } ;;
    esac
    touch -a -c -- "$cache/$sha" 2>/dev/null
  done
  ;;
evict)
  days=$3
  max=$4
  # Kept input sets (see ssh.py send): those unused for the age go, and all but the newest few.
  if cd -- "$base/sets" 2>/dev/null; then
    find . ! -name . -prune -type d -mtime +"$days" 2>/dev/null | while read -r set; do drop_set "$set"; done
    # A set whose spare has been "being built" for a day lost its builder (killed, a reboot): its lock
    # would keep every later send from keeping a spare, so the set goes and the next send starts it afresh.
    for lock in */lock; do
      [ -d "$lock" ] && [ -n "$(find "$lock" -prune -mtime +0 2>/dev/null)" ] && drop_set "${lock%/lock}"
    done
    ls -t | awk -v keep="$KEEP_SETS" 'NR > keep && length($0) == 64 && $0 !~ /[^0-9a-f]/' |
      while read -r set; do drop_set "$set"; done
  fi
  cd -- "$cache" 2>/dev/null || exit 0
  # stale leftovers of a send that was cut short
  find . ! -name . -prune -name '.incoming-*' -mtime +0 -exec rm -rf -- {} + 2>/dev/null
  # an entry a job or a kept input set still links to frees nothing by losing its name: it stays
  find . ! -name . -prune -type f -links 1 -atime +"$days" -exec rm -f -- {} +
  # Nothing to do while every entry together fits (one listing, the common case).
  all=$(ls -ln | awk '$1 ~ /^-/ && length($NF) == 64 && $NF !~ /[^0-9a-f]/ { t += $5 } END { printf "%.0f", t }')
  [ "$all" -gt "$max" ] || exit 0
  # Oldest first; an entry still linked from a job (a link count above 1 that no kept set's spare
  # accounts for) frees nothing and stays. An entry held only by spares goes, and so do those spares.
  {
    (cd -- "$base" && ls -Rlni sets 2>/dev/null) | awk '
      /:$/ { n = split(substr($0, 1, length($0) - 1), p, "/"); set = n >= 2 ? p[2] : ""; next }
      NF >= 10 && $2 ~ /^-/ && set != "" { print "S", $1, set }'
    ls -lnrtiu | awk '$2 ~ /^-/ && length($NF) == 64 && $NF !~ /[^0-9a-f]/ { print "C", $1, $3, $6, $NF }'
  } | awk -v max="$max" '
    $1 == "S" { held[$2]++; sets[$2] = sets[$2] " " $3; next }
    $1 == "C" && $3 - held[$2] == 1 { n++; ino[n] = $2; size[n] = $4; name[n] = $5; total += $4 }
    END {
      for (i = 1; i <= n && total > max; i++) {
        print "entry", name[i]
        k = split(sets[ino[i]], s, " ")
        for (j = 1; j <= k; j++) print "set", s[j]
        total -= size[i]
      }
    }' |
    while read -r what name; do
      case $name in *[!0-9a-f]*|'') continue ;; esac
      case $what in
        entry) rm -f -- "$name" ;;
        set) drop_set "$base/sets/$name" ;;
      esac
    done
  ;;
*)
  echo "cache.sh: unknown operation $op" >&2
  exit 2
  ;;
esac
