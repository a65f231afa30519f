#!/bin/sh
# envfile.sh FILE [--login-path]: write the environment on stdin (NAME=<base64> lines, the launcher's
# format) to FILE, readable by this user only, whole or not at all. For a job that another program
# starts (sbatch, SkyPilot's exec), which cannot hand it a stdin: the job's own script reads FILE and
# removes it. With --login-path the far side's own PATH comes first (that program may run the job with
# another one); the job's variables, read after it, still win.
set -e
umask 077
f=$1
rm -f -- "$f.tmp"
{
  if [ "${2-}" = --login-path ]; then printf 'PATH=%s\n' "$(printf '%s' "$PATH" | base64 | tr -d '\n')"; fi
  cat
} > "$f.tmp"
mv -f -- "$f.tmp" "$f"
