#!/bin/sh
# skypilot-start.sh DIR: started by the SkyPilot job in the job folder. The launcher with the
# environment start left in skypilot.env (removed before the command runs), then wait while the
# command runs, so SkyPilot (and its autostop) sees the cluster busy exactly as long as the job.
d=$1
cd -- "$d" || exit 97
if [ -f skypilot.env ]; then
  exec 3< skypilot.env
  rm -f skypilot.env
  sh launch.sh "$d" <&3 >/dev/null || exit $?
  exec 3<&-
fi
[ -f pid ] || { echo "the job was not started" >&2; exit 97; }
read -r pg < pid
while [ ! -f exit_code ] && kill -0 -"$pg" 2>/dev/null; do sleep 2; done
exit 0
