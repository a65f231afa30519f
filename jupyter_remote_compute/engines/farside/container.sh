#!/bin/sh
# container.sh JOBDIR PINS IMAGE RUNTIME NETWORK NAMES ENTRY GPUS [RUNTIME ARG...]: the job's command.sh,
# run inside IMAGE (environments/image.py writes the call into command.sh). RUNTIME is podman, docker or auto
# (podman, else docker); NETWORK is host or none, never the runtime's own bridge. NAMES are the job's
# variables (set in this shell by launch.sh): their values go through a 0600 file in the job folder,
# never a command line or the container's config, and ENTRY (run by the image's sh with that file and
# command.inner.sh as its arguments) reads and removes it. The job folder is mounted at its own path,
# work/ is the working directory, and files written there belong to this user (rootless podman:
# --userns=keep-id; otherwise --user UID:GID). JRC_IMAGE_DIGEST is the pinned id, for env.sh inside
# (a Python environment built in the image is named by it). The image is pinned on first use: PINS
# (<base>/images) keeps the id it had, and later jobs run that id. A pull is watched
# (REMOTE_COMPUTE_PULL_TIMEOUT) and may use a private registry's user:password
# (REMOTE_COMPUTE_REGISTRY_AUTH, environments/image_registry.py); pinned images no job used for
# REMOTE_COMPUTE_IMAGE_MAX_AGE_DAYS are removed. The container is the runtime's foreground `run --rm`,
# so its exit code is the job's and it is gone when this script ends; a TERM (cancel.sh, scancel) stops
# it (cancel.sh removes one left behind by a KILL, named in JOBDIR/container). GPUS is what the job
# gets of the machine's GPUs: none, all, a count, or visible (those the machine chose, else none);
# where CUDA_VISIBLE_DEVICES is set (an agent's per-job choice, Slurm's allocation) it names the devices.
set -u
# Slurm's warning before the time limit, sent to the job's process group (a batch job's warn_command), is
# for the command in the container: this shell ignores it, and its wait for the run goes on.
trap '' USR1
jobdir=$1 pins=$2 image=$3 runtime=$4 network=$5 names=$6 entry=$7 gpus=$8
shift 8
# From the run's start on (stopping set), whatever ends this script takes the job's files with it.
fail() { printf 'container: %s\n' "$*" >&2; [ -z "${stopping:-}" ] || tidy; exit 125; }
# The pull's settings and a private registry's user:password (environments/image_registry.py), from the launcher's
# stdin: plain shell variables from here on, out of the environment every later program is given.
auth=${REMOTE_COMPUTE_REGISTRY_AUTH-}
pull_timeout=${REMOTE_COMPUTE_PULL_TIMEOUT:-600} max_age=${REMOTE_COMPUTE_IMAGE_MAX_AGE_DAYS:-30}
unset REMOTE_COMPUTE_REGISTRY_AUTH REMOTE_COMPUTE_PULL_TIMEOUT REMOTE_COMPUTE_IMAGE_MAX_AGE_DAYS
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
# The registry a reference is pulled from, as the runtimes read it: a first part with a dot, a port or
# "localhost" is a host; anything else is Docker Hub.
registry_of() {
  case $1 in */*) first=${1%%/*} ;; *) first= ;; esac
  case $first in *.*|*:*|localhost) printf '%s' "$first" ;; *) printf 'docker.io' ;; esac
}
# What the pull's processes have read so far (/proc/PID/io's rchar, the pull's tree): a pull that
# downloads reads; one waiting on a silent registry reads a few bytes a second. 0 without /proc.
pull_bytes() {
  total=0 level=$1
  while [ -n "$level" ]; do
    next=
    for p in $level; do
      r=$(sed -n 's/^rchar: //p' "/proc/$p/io" 2>/dev/null)
      total=$((total + ${r:-0}))
      next="$next $(cat "/proc/$p/task/"*/children 2>/dev/null)"
    done
    level=$(printf '%s' "$next" | tr -s ' \n' '  ' | sed 's/^ *//;s/ *$//')
  done
  printf '%s' "$total"
}
# pull_watched REF: the runtime's pull, its lines straight into the job's log;
# it fails once neither the log nor the bytes read moved for pull_timeout seconds. A private
# registry's credentials go into a 0600 auth file for this pull only, removed after, whatever the end.
pull_watched() {
  ref=$1 reg=$(registry_of "$1") authdir= words=
  if [ -n "$auth" ]; then
    authdir=$(umask 077 && mktemp -d "$jobdir/.registry-auth.XXXXXX") || fail "cannot write the auth file for $reg"
    key=$(printf '%s' "$auth" | base64 | tr -d '\n')
    hosts="\"$reg\":{\"auth\":\"$key\"}"
    # docker keeps Docker Hub's credentials under its old index URL
    [ "$reg" != docker.io ] || hosts="$hosts,\"https://index.docker.io/v1/\":{\"auth\":\"$key\"}"
    (umask 077 && printf '{"auths":{%s}}\n' "$hosts" > "$authdir/auth.json") || fail "cannot write the auth file for $reg"
    key= hosts=
    cp -p -- "$authdir/auth.json" "$authdir/config.json"
  fi
  # a cancel while pulling leaves no credentials behind
  trap '[ -z "$authdir" ] || rm -rf -- "$authdir"; [ -z "$stopping" ] || tidy; exit 143' TERM INT HUP
  puller= watcher=
  printf 'container: pulling %s from %s\n' "$ref" "$reg"
  log_at=$(wc -c < "$jobdir/log" 2>/dev/null || echo 0)
  stall_file="$jobdir/.pull-stalled"
  rm -f -- "$stall_file"
  if [ -z "$authdir" ]; then "$rt" pull -- "$ref" &
  elif [ "$rt" = docker ]; then docker --config "$authdir" pull -- "$ref" &
  else "$rt" pull --authfile "$authdir/auth.json" -- "$ref" & fi
  puller=$!
  # The watch runs beside the pull, so a pull that ends is seen at once, not at the next look.
  (
    # podman reads the layers itself; docker's client reads only the daemon's progress messages (about
    # 150 bytes each, a few a second while bytes move). Idle, either reads a few bytes a second at most.
    quiet=0 said=0 bytes=0 size=$log_at least=1024
    [ "$rt" != docker ] || least=100
    while kill -0 "$puller" 2>/dev/null; do
      sleep 1
      now_bytes=$(pull_bytes "$puller") now_size=$(wc -c < "$jobdir/log" 2>/dev/null || echo 0)
      if [ "$now_size" != "$size" ] || [ $((now_bytes - bytes)) -ge "$least" ]; then quiet=0; else quiet=$((quiet + 1)); fi
      bytes=$now_bytes size=$now_size said=$((said + 1))
      # podman prints a line per layer, and no bytes without a terminal: say how much it has read
      if [ "$rt" = podman ] && [ "$said" -ge 10 ] && [ "$quiet" = 0 ]; then
        printf 'container: pulling %s: %s MB read\n' "$ref" "$((bytes / 1000000))"
        said=0 size=$(wc -c < "$jobdir/log" 2>/dev/null || echo 0)
      fi
      if [ "$quiet" -ge "$pull_timeout" ]; then : > "$stall_file"; kill "$puller" 2>/dev/null; exit 0; fi
    done
  ) &
  watcher=$!
  wait "$puller"
  code=$?
  kill "$watcher" 2>/dev/null
  wait "$watcher" 2>/dev/null
  stalled=
  [ ! -e "$stall_file" ] || { stalled=1; rm -f -- "$stall_file"; }
  [ -z "$authdir" ] || rm -rf -- "$authdir"
  if [ -n "$stopping" ]; then trap stop TERM INT HUP; else trap - TERM INT HUP; fi
  [ -z "$stalled" ] || fail "pulling $ref from $reg made no progress for $pull_timeout s (the machine's pull_timeout): is $reg reachable from this machine?"
  [ "$code" = 0 ] && return 0
  words=$(tail -c +"$((log_at + 1))" "$jobdir/log" 2>/dev/null | grep -v '^container: \|^Trying to pull\|^Getting image\|^Copying \|^Writing manifest\|^Storing sign' | grep . | tail -n 1)
  return 1
}
pull() {
  pull_watched "$1" || fail "pulling $1 from $reg failed: ${words:-(the runtime's words are above)}"
}
# Make the pinned id present again (removed, pruned): pulled by its registry digest, never by the tag.
repin() {
  image_id "$id" >/dev/null && return
  gone="image $image (pinned as $id) is gone from $rt's store"
  [ "$repo" != - ] || fail "$gone and has no registry digest: remove $pin to pin it again"
  pull_watched "$repo" || fail "$gone and pulling $repo from $reg failed: ${words:-(the runtime's words are above)}; remove $pin to pin it again"
  image_id "$id" >/dev/null || fail "image $repo is no longer $id: remove $pin to pin it again"
}
id= repo=- version= stopping=
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
# environments/image.py reads this line back from the log (the MLflow run's image tags).
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
# signals: the stop and the removal end within Slurm's KillWait, as the KILL that follows it would leave
# the container behind. The container's first process ignores a TERM it has no handler for (a shell
# running the command), so the stop often takes its whole grace: half of KillWait, the other half for the
# runtime's own work (rootless podman on a busy node took more than 5 s).
grace=10
if [ -n "${SLURM_JOB_ID:-}" ]; then
  kill_wait=$(scontrol show config 2>/dev/null | sed -n 's/^KillWait *= *\([0-9]*\).*/\1/p')
  if [ -n "$kill_wait" ] && [ "$kill_wait" -lt 20 ]; then grace=$((kill_wait > 3 ? kill_wait / 2 : 1)); fi
fi
# The entry creates RAN before it runs the command: without it, a run that ended never started the
# container (a leftover name of an earlier start, a pinned id pruned since), and its code is the
# runtime's, not the command's.
ran="$jobdir/.container-ran"
tidy() { rm -f -- "$envfile" "$ran" "$jobdir/.container-err" "$jobdir/container"; }
gone() { "$rt" rm -f -- "$name" >/dev/null 2>&1; tidy; }
# removed: podman's run --rm and the clean-up process conmon starts as the container exits both remove
# it, and a run in the background often loses that race and returns while the other still removes it
# (podman#4567): the script ends once the name is gone (forced after 10 s), as its caller expects.
removed() {
  i=0
  while "$rt" container inspect -- "$name" >/dev/null 2>&1; do
    i=$((i + 1))
    if [ "$i" -ge 50 ]; then "$rt" rm -f -- "$name" >/dev/null 2>&1; return; fi
    sleep 0.2
  done
}
stopped= stopping=1 run_pid=
stop() { stopped=1; [ -z "$run_pid" ] || "$rt" stop -t "$grace" -- "$name" >/dev/null 2>&1; }
trap stop TERM INT HUP
# run_container ARG...: the runtime's own foreground run (one call: it creates, attaches, returns the
# command's exit code and removes the container), in this shell's background so that a TERM reaches
# the trap at once. Sets code.
run_container() {
  rm -f -- "$ran"
  "$rt" run --rm --name "$name" --label "jrc.job=$(basename -- "$jobdir")" --init --network "$network" "$who" \
    --log-driver=none -v "$jobdir:$jobdir" -w "$jobdir/work" -e "JRC_IMAGE_DIGEST=$digest" "$@" --entrypoint /bin/sh "$id" \
    "$jobdir/.container-entry" "$envfile" "$jobdir/command.inner.sh" "$jobdir/log" "$ran" \
    </dev/null >/dev/null 2>"$jobdir/.container-err" &
  run_pid=$!
}
# wait_container: the run's exit code (code), once it has ended. A TERM (the trap) ends a wait early,
# and may come before the container exists, where a stop does nothing (docker's, on a container only
# created, neither): once stopped, until the run ends, its container is stopped, or removed while it
# has not started.
wait_container() {
  code=
  if [ -z "$stopped" ]; then
    wait "$run_pid"
    code=$?
    [ -n "$stopped" ] || return 0
  fi
  while kill -0 "$run_pid" 2>/dev/null; do
    if [ -e "$ran" ]; then "$rt" stop -t "$grace" -- "$name"; else "$rt" rm -f -- "$name"; fi >/dev/null 2>&1
    kill -0 "$run_pid" 2>/dev/null || break
    sleep 0.2
  done
  # 127: the first wait had read the run's end, and the TERM came after it
  wait "$run_pid"
  last=$?
  [ "$last" = 127 ] && [ -n "$code" ] || code=$last
}
[ -n "$stopped" ] || run_container "$@"
# Eviction: "<pin>.used" names the runtime and reference, and its mtime is the pin's last use. A pin
# no job used for more than max_age days loses its image, unless a container (a running job's) was made
# from that id or a pin used more recently names it too; removed by reference, without force, so an id
# the user tagged again keeps that name. Only images pinned under PINS are ever removed.
printf '%s %s\n' "$rt" "$image" > "$pin.used.$$" && mv -f -- "$pin.used.$$" "$pin.used"
find "$pins" -name '*.used' -mtime +"$max_age" 2>/dev/null | while IFS= read -r used; do
  old_pin=${used%.used}
  read -r old_rt old_ref < "$used" || continue
  case $old_rt in podman|docker) command -v "$old_rt" >/dev/null 2>&1 || continue ;; *) continue ;; esac
  read -r old_id _ < "$old_pin" || old_id=
  if [ -n "$old_id" ]; then
    [ -z "$("$old_rt" ps -a -q --filter "ancestor=$old_id" < /dev/null 2>/dev/null)" ] || continue
    [ -z "$(find "$pins" -name '*.used' ! -mtime +"$max_age" -exec sh -c 'for u; do read -r i _ < "${u%.used}" && printf "%s\n" "$i"; done' sh {} + 2>/dev/null | grep -Fx -- "$old_id")" ] || continue
  fi
  # the tag, else the pinned id (pulled again by its digest, it may have no tag)
  if "$old_rt" image inspect -- "$old_ref" < /dev/null >/dev/null 2>&1; then target=$old_ref
  elif [ -n "$old_id" ] && "$old_rt" image inspect -- "$old_id" < /dev/null >/dev/null 2>&1; then target=$old_id
  else target=; fi
  if [ -z "$target" ] || "$old_rt" rmi -- "$target" < /dev/null >/dev/null 2>&1; then
    rm -f -- "$old_pin" "$used"
    printf 'container: removed image %s (%s), unused for more than %s days\n' "$old_ref" "$old_rt" "$max_age"
  fi
done
[ -z "$run_pid" ] || wait_container
if [ ! -e "$ran" ] && [ -z "$stopped" ]; then
  # Never started: remove what holds the name, make the pinned id present again, and try once more.
  "$rt" rm -f -- "$name" >/dev/null 2>&1
  repin
  [ -n "$stopped" ] || { run_container "$@"; wait_container; }
  if [ ! -e "$ran" ] && [ -z "$stopped" ]; then
    cat -- "$jobdir/.container-err" >&2
    gone
    fail "$rt could not start image $image (its words are above)"
  fi
fi
# Stopped before it started: nothing ran. Else the runtime's errors on a failed run, not its warnings
# (rootless podman warns on every call), which would push the command's own words out of the reason.
if [ ! -e "$ran" ]; then gone; exit 143; fi
[ "$code" = 0 ] || grep -i '^\(docker: \)\{0,1\}error' -- "$jobdir/.container-err" >&2
removed
tidy
exit "$code"
