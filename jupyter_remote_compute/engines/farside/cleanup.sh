#!/bin/sh
# cleanup.sh DIR JOB_ID: remove the job's folder DIR, only when its job.json names JOB_ID. A folder
# that is gone already is fine (exit 0); one without job.json, or another job's, is refused (exit 3).
d=$1
[ -e "$d" ] || exit 0
[ -f "$d/job.json" ] || { echo "$d is not a job directory (no job.json): left as it is" >&2; exit 3; }
case $(cat -- "$d/job.json") in
  *"\"job_id\": \"$2\""*) ;;
  *) echo "$d belongs to another job (its job.json does not name $2): left as it is" >&2; exit 3 ;;
esac
# directories only: a file may be a hard link to a read-only cache object, whose mode must stay
find "$d" -type d ! -perm -u+w -exec chmod u+w {} + 2>/dev/null
rm -rf -- "$d"
