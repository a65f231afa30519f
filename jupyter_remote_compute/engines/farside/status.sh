#!/bin/sh
# status.sh DIR...: the state of many jobs in one look, one line per DIR, in order:
#   <index> <running|exited|gone|cancelled|notstarted> <exit code or -> <log size or ->
# A job is running while its process group (the pid file) has a member that is not a zombie:
# /proc where it exists (one read per process, no external command), ps otherwise.
alive_groups() {
  if [ -r /proc/self/stat ]; then
    for f in /proc/[0-9]*/stat; do
      line=
      read -r line 2>/dev/null < "$f" || continue
      rest=${line##*")"}
      # the fields after the command name hold no glob characters: the unquoted split is safe
      set -- $rest
      case $1 in Z|X|x) ;; *) printf ' %s' "$3" ;; esac
    done
  else
    ps -A -o pgid= -o stat= | while read -r g s; do case $s in Z*) ;; *) printf ' %s' "$g" ;; esac; done
  fi
}
live=
scanned=
one() {
  d=$2
  if [ ! -d "$d" ]; then echo "$1 gone - -"; return; fi
  size=-
  if [ -f "$d/log" ]; then size=$(wc -c < "$d/log" | tr -d ' '); fi
  if [ -f "$d/exit_code" ]; then read -r c < "$d/exit_code"; echo "$1 exited ${c:--} $size"; return; fi
  if [ ! -f "$d/pid" ]; then echo "$1 notstarted - $size"; return; fi
  read -r pg < "$d/pid"
  if [ -z "$scanned" ]; then live=" $(alive_groups) "; scanned=1; fi
  case "$live" in *" $pg "*) echo "$1 running - $size"; return ;; esac
  # the group is gone; it writes exit_code before it ends, so look again
  if [ -f "$d/exit_code" ]; then read -r c < "$d/exit_code"; echo "$1 exited ${c:--} $size"
  elif [ -f "$d/cancelled" ]; then echo "$1 cancelled - $size"
  else echo "$1 gone - $size"; fi
}
i=0
for d in "$@"; do one "$i" "$d"; i=$((i+1)); done
