#!/bin/sh
# status.sh DIR...: the state of many jobs in one look, one line per DIR, in order:
#   <index> <running|exited|gone|cancelled|notstarted|missing> <exit code or ->
# then "size <index> <bytes>" for every job that has a log.
# A job is running while its process group (the pid file) has a member that is not a zombie:
# /proc where it exists, ps otherwise.
alive_groups() {
  if [ -r /proc/self/stat ]; then
    # One cat and one awk for every process: the fields after the last ") " (the command name may
    # hold spaces and parentheses) are state, parent, process group.
    cat /proc/[0-9]*/stat 2>/dev/null | awk '{ sub(/^.*\) /, ""); if ($1 !~ /^[ZXx]$/) printf " %s", $3 }'
  else
    ps -A -o pgid= -o stat= | while read -r g s; do case $s in Z*) ;; *) printf ' %s' "$g" ;; esac; done
  fi
}
live=
scanned=
logs=
logged=
one() {
  d=$2
  if [ ! -d "$d" ]; then echo "$1 missing -"; return; fi
  # sizes are read at the end, all logs in one wc
  if [ -f "$d/log" ]; then logs="$logs$d/log
"; logged="$logged$1
"; fi
  if [ -f "$d/exit_code" ]; then read -r c < "$d/exit_code"; echo "$1 exited ${c:--}"; return; fi
  if [ ! -f "$d/pid" ]; then echo "$1 notstarted -"; return; fi
  read -r pg < "$d/pid"
  if [ -z "$scanned" ]; then live=" $(alive_groups) "; scanned=1; fi
  case "$live" in *" $pg "*) echo "$1 running -"; return ;; esac
  # the group is gone; it writes exit_code before it ends, so look again
  if [ -f "$d/exit_code" ]; then read -r c < "$d/exit_code"; echo "$1 exited ${c:--}"
  elif [ -f "$d/cancelled" ]; then echo "$1 cancelled -"
  else echo "$1 gone -"; fi
}
i=0
for d in "$@"; do one "$i" "$d"; i=$((i+1)); done
# "size <index> <bytes>" per log, in the order the logs were listed (job directories hold no newline)
if [ -n "$logs" ]; then
  set -f
  IFS='
'
  set -- $logged
  for line in $(wc -c -- $logs 2>/dev/null); do
    [ $# -gt 0 ] || break
    size=${line#"${line%%[! ]*}"}
    echo "size $1 ${size%% *}"
    shift
  done
fi
