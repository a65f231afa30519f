#!/bin/sh
# log.sh DIR OFFSET LIMIT: up to LIMIT bytes of the job's log from byte OFFSET. A job with no log yet
# reads empty; a job folder that is gone is an error (exit 3), so a quiet job and a removed one differ.
d=$1
[ -d "$d" ] || { echo "job directory is missing" >&2; exit 3; }
[ -f "$d/log" ] || exit 0
tail -c +$(($2 + 1)) -- "$d/log" | head -c "$3"
