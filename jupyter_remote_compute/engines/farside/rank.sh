#!/bin/sh
# One process of a job of several, or one node's torchrun: rank.sh JOBDIR MODE [GPUS [JOIN]].
#   plain     an srun task: its rank from Slurm (SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID); without
#             Slurm (a host of an ssh host list) RANK and LOCAL_RANK from "node", NODE_RANK given
#   node      without Slurm, one per node: starts this node's LOCAL_WORLD_SIZE processes as "plain";
#             one failing stops the others, and the node ends with its code
#   torchrun  one per node (an srun task, or a host of an ssh host list, NODE_RANK given): torchrun
#             starts this node's processes, each as "worker";
#             it waits JOIN seconds (600) for every node at the rendezvous, and when it gives up
#             leaves this node's name in ranks/node<N>.waited (the nodes without one never joined)
#   worker    a process torchrun started: RANK, LOCAL_RANK, WORLD_SIZE, GROUP_RANK and the
#             rendezvous (MASTER_ADDR, MASTER_PORT) are torchrun's
# Every line a process writes reaches the job's one log prefixed "[<node> rank R] ", so the nodes'
# lines can be told apart (and filtered) there. Rank 0 records to the job's MLflow store; the other
# ranks to ranks/R/mlruns (under the same scheme), which is not brought back: one job, one run.
# GPUS (per node, as the job asked) sets CUDA_VISIBLE_DEVICES: the node's GPUs are the ones Slurm gave
# the step (its CUDA_VISIBLE_DEVICES), else the first GPUS; a torchrun worker sees all of them (it
# picks cuda:LOCAL_RANK), a plain process its share: the LOCAL_RANK-th of LOCAL_WORLD_SIZE equal
# parts, or one GPU shared in turn where there are fewer GPUs than processes.
set -u
jobdir=$1
mode=$2
gpus=${3:-0}
join=${4:-600}
node=${SLURMD_NODENAME:-$(hostname)}

# Copy stdin to stdout, each line behind $1 as soon as it is whole; lines that start with a
# non-empty $2 (a worker's, prefixed already) pass as they are. With $3, torchrun's word that it gave
# up waiting at the rendezvous writes this node's name to the file $3.
prefixed() {
  trap '' USR1 # a signal a trap catches would end read, and the log with it
  while IFS= read -r line || [ -n "$line" ]; do
    if [ -n "$2" ]; then
      case $line in "$2"*)
        printf '%s\n' "$line"
        continue
        ;;
      esac
    fi
    if [ -n "${3:-}" ]; then
      case $line in *.RendezvousTimeoutError*) printf '%s\n' "$node" > "$3" ;; esac
    fi
    printf '%s%s\n' "$1" "$line"
  done
}

# The node's GPUs, comma-separated ("" when the job asked for none).
node_gpus() {
  [ "$gpus" -gt 0 ] 2>/dev/null || return 0
  if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
    printf '%s' "$CUDA_VISIBLE_DEVICES"
    return 0
  fi
  i=0
  out=
  while [ "$i" -lt "$gpus" ]; do
    out="$out${out:+,}$i"
    i=$((i + 1))
  done
  printf '%s' "$out"
}

# Of the list $1, the share of local rank $2 among $3 processes.
gpu_share() {
  rank=$2
  procs=$3
  old_ifs=$IFS
  IFS=,
  # shellcheck disable=SC2086 # split on commas on purpose
  set -- $1
  IFS=$old_ifs
  n=$#
  [ "$n" -gt 0 ] || return 0
  if [ "$n" -lt "$procs" ]; then
    first=$((rank % n))
    count=1
  else
    count=$((n / procs))
    first=$((rank * count))
  fi
  i=0
  out=
  for gpu in "$@"; do
    if [ "$i" -ge "$first" ] && [ "$i" -lt $((first + count)) ]; then out="$out${out:+,}$gpu"; fi
    i=$((i + 1))
  done
  printf '%s' "$out"
}

# The processes below $1 (its children, theirs, ...), one pid a line.
descendants() {
  ps -A -o pid= -o ppid= | awk -v root="$1" '
    { parent[$1] = $2 }
    END {
      for (p in parent) {
        q = parent[p]
        while (q != root && (q in parent) && q > 1) q = parent[q]
        if (q == root) print p
      }
    }'
}

mkdir -p "$jobdir/ranks" || exit 97
case $mode in
  torchrun)
    NODE_RANK=${SLURM_NODEID:-${NODE_RANK:-0}}
    export NODE_RANK
    code_file="$jobdir/ranks/node$NODE_RANK.exit_code"
    waited="$jobdir/ranks/node$NODE_RANK.waited"
    rm -f "$code_file" "$waited"
    if ! command -v torchrun >/dev/null 2>&1; then
      echo "[$node] jupyter-remote-compute: torchrun is not on PATH on $node: install torch where the" \
        "nodes find it (or set PATH in the job's env), or use launcher plain"
      exit 127
    fi
    # c10d rendezvous at the first node; this node's rank is the one rendezvous gives (GROUP_RANK).
    {
      torchrun --nnodes="$NNODES" --nproc-per-node="$LOCAL_WORLD_SIZE" --rdzv-backend=c10d \
        --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv-id="jrc-${SLURM_JOB_ID:-$MASTER_PORT}" \
        --rdzv-conf="join_timeout=$join" \
        --no-python sh "$jobdir/rank.sh" "$jobdir" worker "$gpus" 2>&1
      echo $? > "$code_file"
    } | prefixed "[$node] " "[$node rank " "$waited"
    code=$(cat "$code_file" 2>/dev/null) || code=143 # no code: torchrun was killed
    # The other nodes that were waiting give up about now too: a moment for them to say so before
    # this node's end makes srun stop them.
    if [ -f "$waited" ]; then sleep 5; fi
    exit "${code:-143}"
    ;;
  worker)
    NODE_RANK=${GROUP_RANK:-$NODE_RANK}
    visible=$(node_gpus)
    ;;
  node)
    # This node's processes, each a "plain" rank.sh. When one fails (its ranks/R/exit_code says so)
    # the others' commands are stopped, as srun's --kill-on-bad-exit does; the node's code is the
    # failing one's.
    n=${LOCAL_WORLD_SIZE:-1}
    i=0
    pids=
    ranks=
    while [ "$i" -lt "$n" ]; do
      r=$((NODE_RANK * n + i))
      rm -f "$jobdir/ranks/$r/exit_code"
      RANK=$r LOCAL_RANK=$i sh "$jobdir/rank.sh" "$jobdir" plain "$gpus" &
      pids="$pids $!"
      ranks="$ranks $r"
      i=$((i + 1))
    done
    code=0
    while [ "$code" = 0 ]; do
      left=
      for r in $ranks; do
        if [ -f "$jobdir/ranks/$r/exit_code" ]; then
          c=$(cat "$jobdir/ranks/$r/exit_code")
          [ "${c:-0}" = 0 ] || code=$c
        else
          left=1
        fi
      done
      [ -n "$left" ] || break
      [ "$code" != 0 ] || sleep 1
    done
    if [ "$code" != 0 ]; then
      for p in $pids; do
        # shellcheck disable=SC2046 # one pid a word
        kill -TERM $(descendants "$p") 2>/dev/null
      done
    fi
    for p in $pids; do wait "$p"; done
    exit "$code"
    ;;
  plain)
    RANK=${SLURM_PROCID:-$RANK}
    LOCAL_RANK=${SLURM_LOCALID:-$LOCAL_RANK}
    NODE_RANK=${SLURM_NODEID:-$NODE_RANK}
    visible=$(gpu_share "$(node_gpus)" "$LOCAL_RANK" "${LOCAL_WORLD_SIZE:-1}")
    ;;
  *)
    echo "rank.sh: unknown mode $mode" >&2
    exit 2
    ;;
esac
export RANK LOCAL_RANK NODE_RANK
if [ -n "$visible" ]; then
  CUDA_VISIBLE_DEVICES=$visible
  export CUDA_VISIBLE_DEVICES
fi
dir="$jobdir/ranks/$RANK"
mkdir -p "$dir" || exit 97
if [ "$RANK" != 0 ]; then
  # under the scheme rank 0's store has (file, or the launcher's own for a user whose store is not a folder)
  scheme=${MLFLOW_TRACKING_URI:-file://}
  MLFLOW_TRACKING_URI="${scheme%%://*}://$dir/mlruns"
  export MLFLOW_TRACKING_URI
fi
rm -f "$dir/exit_code"
printf '%s\n' "$node" > "$dir/node"
# Slurm's warning before the time limit (srun passes it on to every process of the step) is for the
# command: these shells note it and wait on, while the command's own programs get it as they started.
trap : USR1
{
  trap : USR1
  sh "$jobdir/command.sh" 2>&1
  echo $? > "$dir/exit_code"
} | prefixed "[$node rank $RANK] " ""
code=$(cat "$dir/exit_code" 2>/dev/null) || code=143 # no code: the command was killed
exit "${code:-143}"
