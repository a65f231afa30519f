#!/bin/sh
# cache.sh OP BASE ...: the input cache of one machine, <BASE>/cache/<sha256>, one read-only file
# per content. A job's inputs are hard links to it (an executable input gets its own copy), so a
# file sent once costs a name, not its bytes, the next time. An entry's mtime is its last use.
#
#   have BASE            digests on stdin up to an empty line -> "<sha256> <size>" for each present
#                        (and marked used)
#   link BASE JOBDIR     "<sha256> <octal mode> <base64 path>" lines on stdin: put each cached
#                        content at JOBDIR/work/<path>; prints "missing <sha256>" for any not cached
#   adopt BASE JOBDIR    "<sha256> <size> <octal mode> <base64 path>" lines: files that arrived in the work tree
#                        become cache entries (linked back); prints "bad <base64 path>" for a file
#                        of the wrong size
#   evict BASE DAYS MAX  drop entries unused for more than DAYS days, then the least recently used
#                        until the rest (entries no job links to) holds at most MAX bytes
op=$1
base=$2
cache=$base/cache
case $op in
have)
  mkdir -p -- "$cache" || exit 3
  cd -- "$cache" || exit 3
  while IFS= read -r sha && [ -n "$sha" ]; do
    case $sha in *[!0-9a-f]*|'') continue ;; esac
    [ -f "$sha" ] || continue
    touch -c -- "$sha" 2>/dev/null
    set -- $(ls -lnd -- "$sha")
    echo "$sha $5"
  done
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
    touch -c -- "$cache/$sha" 2>/dev/null
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
    touch -c -- "$cache/$sha" 2>/dev/null
  done
  ;;
evict)
  days=$3
  max=$4
  cd -- "$cache" 2>/dev/null || exit 0
  # stale leftovers of a send that was cut short
  find . ! -name . -prune -name '.incoming-*' -mtime +0 -exec rm -rf -- {} + 2>/dev/null
  find . ! -name . -prune -type f -mtime +"$days" -exec rm -f -- {} +
  # oldest first; an entry still linked from a job (link count above 1) frees nothing and stays
  ls -lnrt | awk -v max="$max" '
    $1 ~ /^-/ && length($NF) == 64 && $NF !~ /[^0-9a-f]/ && $2 == 1 { n++; name[n] = $NF; size[n] = $5; total += $5 }
    END { for (i = 1; i <= n && total > max; i++) { print name[i]; total -= size[i] } }' |
    while read -r sha; do rm -f -- "$sha"; done
  ;;
*)
  echo "cache.sh: unknown operation $op" >&2
  exit 2
  ;;
esac
