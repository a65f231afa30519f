#!/bin/sh
# status.sh [--metrics] DIR...: the state of many jobs in one look, one line per DIR, in order:
#   <index> <running|exited|gone|cancelled|notstarted|missing> <exit code or ->
# and, for a running job whose environment is being built, "building <index> <tool> <requirements>";
# "warned <index>" for a job its scheduler warned it will be stopped soon (time_limit_warning);
# then "size <index> <bytes>" for every job that has a log.
# With --metrics, standard input names the jobs someone watches ("watch <index>") and the bytes of
# their MLflow metric files already read ("at <index> <offset> <path under mlruns/>"); after a line
# "@@metrics" come the new bytes of each such file, at most 1 MiB a file:
#   metric <index> <offset> <count> <path under mlruns/>   then exactly <count> bytes.
metrics=
if [ "${1:-}" = --metrics ]; then metrics=1; shift; fi
dirs=
for d in "$@"; do dirs="$dirs$d
"; done
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
  if [ -f "$d/time_limit_warning" ]; then echo "warned $1"; fi
  # sizes are read at the end, all logs in one wc
  if [ -f "$d/log" ]; then logs="$logs$d/log
"; logged="$logged$1
"; fi
  if [ -f "$d/exit_code" ]; then read -r c < "$d/exit_code"; echo "$1 exited ${c:--}"; return; fi
  if [ ! -f "$d/pid" ]; then echo "$1 notstarted -"; return; fi
  read -r pg < "$d/pid"
  if [ -z "$scanned" ]; then live=" $(alive_groups) "; scanned=1; fi
  case "$live" in *" $pg "*)
    echo "$1 running -"
    # env.sh's build under way: "building <index> <tool> <requirements>"
    if [ -f "$d/env.state" ]; then read -r b < "$d/env.state" && echo "building $1 $b"; fi
    return ;;
  esac
  # the group is gone; it writes exit_code before it ends, so look again
  if [ -f "$d/exit_code" ]; then read -r c < "$d/exit_code"; echo "$1 exited ${c:--}"
  elif [ -f "$d/cancelled" ]; then echo "$1 cancelled -"
  else
    # The launcher was KILLed (a reboot, the OOM killer): container.sh never saw its container end, which
    # would run on with no one to read it. The job is lost; its container is killed at once (podman's
    # -t 0; docker's rm -f kills), as the poll waits on this.
    if [ -f "$d/container" ] && read -r rt name < "$d/container"; then
      case $rt in
        podman) podman rm -f -t 0 -- "$name" >/dev/null 2>&1 </dev/null && rm -f -- "$d/container" ;;
        docker) docker rm -f -- "$name" >/dev/null 2>&1 </dev/null && rm -f -- "$d/container" ;;
      esac
    fi
    echo "$1 gone -"
  fi
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
# The metric files of watched jobs: read after their state, so a job seen exited shows every point
# it logged. Run metrics only (<experiment>/<run>/metrics/<key>, a key may hold "/"). One wc and one
# awk per watched job find the files that grew; only those are read.
if [ -n "$metrics" ]; then
  watch=$(cat)
  echo @@metrics
  unset IFS
  set +f
  i=0
  printf '%s' "$dirs" | while IFS= read -r d; do
    case "
$watch
" in
    *"
watch $i
"*)
      {
        printf '%s\n@@sizes\n' "$watch"
        for m in "$d"/mlruns/*/*/metrics; do [ -d "$m" ] && find "$m" -type f -exec wc -c {} +; done
      } | awk -v i="$i" -v root="$d/mlruns/" '
        !sizes && $0 == "@@sizes" { sizes = 1; next }
        !sizes { p = $0; if ($1 == "at" && $2 == i && sub(/^at [0-9]+ [0-9]+ /, "", p)) at[p] = $3; next }
        { p = $0; sub(/^ *[0-9]+ /, "", p)
          if (substr(p, 1, length(root)) != root) next
          rel = substr(p, length(root) + 1); off = (rel in at) ? at[rel] : 0
          if ($1 + 0 > off + 0) { n = $1 - off; if (n > 1048576) n = 1048576; print off, n, rel } }' |
        while read -r off n rel; do
          echo "metric $i $off $n $rel"
          tail -c +$((off + 1)) -- "$d/mlruns/$rel" | head -c "$n"
        done
      ;;
    esac
    i=$((i+1))
  done
fi
