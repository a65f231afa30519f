#!/bin/sh
# manifest.sh DIR NAME OUTPUT...: the declared outputs of the job in DIR (paths under work/) and
# its mlruns/, as one tar stream on stdout whose first entry NAME is the manifest:
#   M <index>          output <index> does not exist
#   <sha256>  <path>   every regular file (sha256sum's format, its escaping included)
#   T <kilobytes>      the size of everything that follows
# Nothing is followed through a link: a link inside an output is sent as a link, for this side
# to refuse.
cd -- "$1" || { echo "job directory $1 is missing" >&2; exit 3; }
m=$2
shift 2
command -v tar >/dev/null 2>&1 || { echo "tar is not installed on this machine: install it" >&2; exit 3; }
if command -v sha256sum >/dev/null 2>&1; then hasher="sha256sum --"; else hasher="shasum -a 256 --"; fi
trap 'rm -f -- "$m"' EXIT
: > "$m"
i=0
n=$#
while [ $i -lt "$n" ]; do
  p="work/$1"
  shift
  if [ -e "$p" ] || [ -h "$p" ]; then set -- "$@" "$p"; else echo "M $i" >> "$m"; fi
  i=$((i+1))
done
if [ -d mlruns ]; then set -- "$@" mlruns; fi
if [ $# -gt 0 ]; then
  find "$@" -type f -exec $hasher {} + >> "$m"
  du -sk -- "$@" | { t=0; while read -r k _; do case $k in ''|*[!0-9]*) ;; *) t=$((t+k)) ;; esac; done; echo "T $t" >> "$m"; }
fi
tar -cf - "$m" "$@"
