#!/bin/sh
# container.sh JOBDIR PINS IMAGE RUNTIME NETWORK NAMES ENTRY GPUS [RUNTIME ARG...]: the job's command.sh,
# run inside IMAGE (jobs/image.py writes the call into command.sh). RUNTIME is podman, docker or auto
# (podman, else docker); NETWORK is host or none, never the runtime's own bridge. NAMES are the job's
# variables (set in this shell by launch.sh): their values go through a 0600 file in the job folder,
# never a command line or the container's config, and ENTRY (run by the image's sh with that file and
# command.inner.sh as its arguments) reads and removes it. The job folder is mounted at its own path,
# work/ is the working directory, and files written there belong to this user (rootless podman:
# --userns=keep-id; otherwise --user UID:GID). JRC_IMAGE_DIGEST is the pinned id, for env.sh inside
# (a Python environment built in the image is named by it). The image is pinned on first use: PINS (<base>/images)
# keeps the id it had, and later jobs run that id. The container is run detached and waited for, so its exit
# code is the job's; a TERM (cancel.sh, scancel) stops it, and it is removed before this script ends
# (cancel.sh removes one left behind by a KILL, named in JOBDIR/container). GPUS is what the job gets
# of the machine's GPUs: none, all, a count, or visible (those the machine chose, else none); where
# CUDA_VISIBLE_DEVICES is set (an agent's per-job choice, Slurm's allocation) it names the devices.
set -u
jobdir=$1 pins=$2 image=$3 runtime=$4 network=$5 names=$6 entry=$7 gpus=$8
shift 8
fail() { printf 'container: %s\n' "$*" >&2; exit 125; }
if [ "$runtime" = auto ]; then
  if command -v podman >/dev/null 2>&1; then runtime=podman
  elif command -v docker >/dev/null 2>&1; then runtime=docker
  else fail "neither podman nor docker is installed on this machine: install one (apt-get install podman)"; fi
fi
command -v "$runtime" >/dev/null 2>&1 || fail "$runtime is not installed on this machine: install it (apt-get install $runtime)"
rt=$runtime
uid=$(id -u)
if [ "$rt" = podman ] && [ "$uid" != 0 ]; then who=--userns=keep-id mode=rootless
else who="--user=$uid:$(id -g)" mode=rootful; fi

# The GPU flags, after the runtime arguments given: docker's --gpus (the NVIDIA runtime), podman's
# CDI devices (the spec nvidia-ctk generates names them by index, UUID and all). A machine without
# them fails the start with the runtime's own words (podman: "unresolvable CDI devices").
case $gpus in
  none|all|visible) ;;
  *[!0-9]*|''|0*) fail "GPUS is $gpus: expected none, all, visible or a count" ;;
esac
devices=
if [ "$gpus" != none ] && [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then devices=$CUDA_VISIBLE_DEVICES
elif [ "$gpus" = visible ]; then gpus=none; fi
if [ -n "$devices" ]; then
  if [ "$rt" = docker ]; then set -- "$@" --gpus "\"device=$devices\""; fi
  # Inside, the devices given are numbered from 0: the job's CUDA_VISIBLE_DEVICES names them so.
  n=0 inside= old_ifs=$IFS IFS=,
  for d in $devices; do
    [ "$rt" = docker ] || set -- "$@" "--device=nvidia.com/gpu=$d"
    inside=${inside:+$inside,}$n n=$((n + 1))
  done
  IFS=$old_ifs CUDA_VISIBLE_DEVICES=$inside
elif [ "$gpus" = all ]; then
  if [ "$rt" = docker ]; then set -- "$@" --gpus all; else set -- "$@" --device=nvidia.com/gpu=all; fi
elif [ "$gpus" != none ]; then
  if [ "$rt" = docker ]; then set -- "$@" --gpus "$gpus"
  else
    i=0
    while [ "$i" -lt "$gpus" ]; do set -- "$@" "--device=nvidia.com/gpu=$i"; i=$((i + 1)); done
  fi
fi
# With GPUs the entry first puts in the log the driver's CUDA version and the GPUs the container sees.
gpu_probe=
if [ "$gpus" != none ]; then
  gpu_probe='{ if command -v nvidia-smi >/dev/null 2>&1; then
  cuda=$(nvidia-smi 2>/dev/null | sed -n "s/.*CUDA Version: *\([0-9.]*\).*/\1/p" | head -n 1)
  seen=$(nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>&1 | tr "\n" ";" | sed "s/;$//; s/;/; /g")
  printf "gpus: CUDA %s; %s\n" "${cuda:-unknown}" "${seen:-none seen}"
else printf "gpus: nvidia-smi is not in the image: which GPUs it sees is not known\n"; fi; } >> "$3" 2>&1
'
fi

# The pin: "<id> <repo digest or -> <runtime version>", one file per runtime and reference. A pinned
# job asks the runtime nothing before its run: every call costs a tenth of a second or more.
(umask 077 && mkdir -p -- "$pins") || fail "cannot create $pins"
pin="$pins/$(printf '%s %s' "$rt" "$image" | sha256sum | cut -c1-32)"
image_id() { "$rt" image inspect --format '{{.Id}}' "$1" 2>/dev/null; }
pull() {
  printf 'container: pulling %s\n' "$1"
  "$rt" pull "$1" || fail "pulling $1 failed (the runtime's words are above)"
}
# Make the pinned id present again (removed, pruned): pulled by its registry digest, never by the tag.
repin() {
  image_id "$id" >/dev/null && return
  gone="image $image (pinned as $id) is gone from $rt's store"
  [ "$repo" != - ] || fail "$gone and has no registry digest: remove $pin to pin it again"
  printf 'container: pulling %s\n' "$repo"
  "$rt" pull "$repo" || fail "$gone and pulling $repo failed (the runtime's words are above): remove $pin to pin it again"
  image_id "$id" >/dev/null || fail "image $repo is no longer $id: remove $pin to pin it again"
}
id= repo=- version=
if [ -s "$pin" ]; then
  read -r id repo version < "$pin"
else
  image_id "$image" >/dev/null || pull "$image"
  id=$(image_id "$image") || fail "image $image is not in $rt's store after pulling it"
  repo=$("$rt" image inspect --format '{{range .RepoDigests}}{{.}} {{end}}' "$image" 2>/dev/null | cut -d' ' -f1)
  version=$("$rt" --version 2>/dev/null | sed -n 's/.*[Vv]ersion \([^ ,]*\).*/\1/p')
  printf '%s %s %s\n' "$id" "${repo:--}" "${version:-unknown}" > "$pin.$$" && mv -f -- "$pin.$$" "$pin"
fi
case $id in sha256:*) digest=$id ;; *) digest=sha256:$id ;; esac
# jobs/image.py reads this line back from the log (the MLflow run's image tags).
printf 'image %s %s (%s %s, %s)\n' "$image" "$digest" "$rt" "${version:-unknown}" "$mode"

name="jrc-$(basename -- "$jobdir")"
envfile="$jobdir/.container-env"
(
  umask 077
  for n in $names; do
    eval "given=\${$n+x}"
    [ -n "$given" ] || continue
    eval "value=\$$n"
    printf '%s=%s\n' "$n" "$(printf '%s' "$value" | base64 | tr -d '\n')"
  done > "$envfile"
) || fail "cannot write the job's environment file"
printf '%s%s' "$gpu_probe" "$entry" > "$jobdir/.container-entry"
printf '%s %s\n' "$rt" "$name" > "$jobdir/container"
# A TERM (cancel.sh; in a Slurm batch job scancel or the time limit, which send CONT then TERM to
# every process of the job) stops the container. Its processes are conmon's, which no one else
# signals: the stop ends within Slurm's KillWait, as the KILL that follows it would leave them running.
grace=10
if [ -n "${SLURM_JOB_ID:-}" ]; then
  kill_wait=$(scontrol show config 2>/dev/null | sed -n 's/^KillWait *= *\([0-9]*\).*/\1/p')
  if [ -n "$kill_wait" ] && [ "$kill_wait" -lt 12 ]; then grace=$((kill_wait > 2 ? kill_wait - 2 : 1)); fi
fi
stopped=
stop() { stopped=1; "$rt" stop -t "$grace" -- "$name" >/dev/null 2>&1; }
trap stop TERM INT HUP
start() {
  "$rt" run -d --name "$name" --label "jrc.job=$(basename -- "$jobdir")" --init --network "$network" "$who" \
    --log-driver=none -v "$jobdir:$jobdir" -w "$jobdir/work" -e "JRC_IMAGE_DIGEST=$digest" "$@" --entrypoint /bin/sh "$id" \
    "$jobdir/.container-entry" "$envfile" "$jobdir/command.inner.sh" "$jobdir/log" >/dev/null
}
gone() {
  "$rt" rm -f -- "$name" >/dev/null 2>&1
  rm -f -- "$envfile" "$jobdir/.container-err" "$jobdir/container"
}
if ! start "$@" 2>"$jobdir/.container-err"; then
  # Stopped while it started (the TERM reached the runtime too): not started again.
  [ -z "$stopped" ] || { gone; exit 143; }
  # An earlier start of this same job that never ran holds the name, or the pinned id is gone.
  "$rt" rm -f -- "$name" >/dev/null 2>&1
  repin
  if ! start "$@"; then
    cat -- "$jobdir/.container-err" >&2
    gone
    fail "$rt could not start image $image (its words are above)"
  fi
fi
rm -f -- "$jobdir/.container-err"
[ -z "$stopped" ] || stop  # the TERM came while it started: the trap found no container yet
# wait prints the exit code (the container is kept until then: -d --rm would lose it). A TERM ends
# the wait early: the trap has stopped the container, and a second wait reads what it ended with.
code=$("$rt" wait -- "$name" 2>/dev/null)
if [ -n "$stopped" ]; then code=$("$rt" wait -- "$name" 2>/dev/null); fi
"$rt" rm -f -- "$name" >/dev/null 2>&1
rm -f -- "$envfile" "$jobdir/container"
case $code in ''|*[!0-9]*) fail "the container of this job vanished before its exit code was read" ;; esac
exit "$code"
