#!/bin/sh
# prepare.sh DIR MARKER LAUNCH RUN: make the job's folder DIR with its work/ tree and mark it as this
# job's. MARKER is the text of job.json ({"job_id": …, "key": …}); a DIR whose job.json another job
# wrote is refused (exit 3) and left as it is, never taken over. LAUNCH and RUN are the launcher's two
# scripts (launch.sh, run.sh). Prints the folder's physical absolute path on its last line.
# mlruns/ is left for MLflow to make: its file store creates the Default experiment only in a
# folder that does not exist yet (an empty one fails every run logged without an experiment).
set -e
d=$1
# The job's folder, and any folder above it made now (the base), are the user's only: another user of
# the machine reads none of its inputs, log or records. What the job itself writes keeps its umask.
(umask 077 && mkdir -p -- "$d/work")
cd -- "$d"
# A name of this process's own: a prepare left running by a sender that died may still be writing here.
tmp=job.json.tmp.$$
printf '%s' "$2" > "$tmp"
if [ -f job.json ] && ! cmp -s job.json "$tmp"; then
  rm -f "$tmp"
  echo "job directory $d belongs to another job (its job.json names it); it was left as it is" >&2
  exit 3
fi
mv -f "$tmp" job.json
printf '%s' "$3" > launch.sh
printf '%s' "$4" > run.sh
pwd -P
