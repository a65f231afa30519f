#!/bin/sh
# cancel.sh DIR GRACE_TENTHS: TERM the job's process group, KILL what is left after the grace,
# then verify no member remains. Prints "done" or "notstarted"; exit 4 names survivors.
d=$1
ticks=$2
[ -f "$d/pid" ] || { echo notstarted; exit 0; }
read -r target_pg < "$d/pid"
case $target_pg in ''|*[!0-9]*) echo "bad pid file in $d" >&2; exit 3 ;; esac
group_pids() {
  if [ -r /proc/self/stat ]; then
    cat /proc/[0-9]*/stat 2>/dev/null |
      awk -v pg="$target_pg" '{ pid = $1; sub(/^.*\) /, ""); if ($3 == pg && $1 !~ /^[ZXx]$/) printf " %s", pid }'
  else
    ps -A -o pid= -o pgid= -o stat= | while read -r p g s; do
      case $s in Z*) ;; *) [ "$g" = "$target_pg" ] && printf ' %s' "$p" ;; esac
    done
  fi
}
nap() { sleep 0.1 2>/dev/null || sleep 1; }
# status.sh reports a group that ended this way as cancelled, not as vanished
: > "$d/cancelled"
kill -s TERM -- "-$target_pg" 2>/dev/null
i=0
while [ -n "$(group_pids)" ] && [ $i -lt "$ticks" ]; do nap; i=$((i+1)); done
if [ -n "$(group_pids)" ]; then kill -s KILL -- "-$target_pg" 2>/dev/null; fi
i=0
while [ -n "$(group_pids)" ] && [ $i -lt 50 ]; do nap; i=$((i+1)); done
left=$(group_pids)
if [ -n "$left" ]; then echo "processes of group $target_pg survived SIGKILL:$left" >&2; exit 4; fi
# A job in a container (container.sh) that was KILLed before it removed its container: remove it here.
if [ -f "$d/container" ]; then read -r rt name < "$d/container" && "$rt" rm -f -- "$name" >/dev/null 2>&1; rm -f -- "$d/container"; fi
echo done
