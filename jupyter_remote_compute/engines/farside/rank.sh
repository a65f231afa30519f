#!/bin/sh
# One process of a job of several, or one node's torchrun: rank.sh JOBDIR MODE.
#   plain     an srun task: its rank from Slurm (SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID)
#   torchrun  an srun task, one per node: torchrun starts this node's processes, each as "worker"
#   worker    a process torchrun started: RANK, LOCAL_RANK, WORLD_SIZE, GROUP_RANK and the
#             rendezvous (MASTER_ADDR, MASTER_PORT) are torchrun's
# Every line a process writes reaches the job's one log prefixed "[<node> rank R] ", so the nodes'
# lines can be told apart (and filtered) there. Rank 0 records to the job's MLflow store; the other
# ranks to ranks/R/mlruns, which is not brought back: one job, one run.
set -u
jobdir=$1
mode=$2
node=${SLURMD_NODENAME:-$(hostname)}

# Copy stdin to stdout, each line behind $1 as soon as it is whole; lines that start with a
# non-empty $2 (a worker's, prefixed already) pass as they are.
prefixed() {
  while IFS= read -r line || [ -n "$line" ]; do
    if [ -n "$2" ]; then
      case $line in "$2"*)
        printf '%s\n' "$line"
        continue
        ;;
      esac
    fi
    printf '%s%s\n' "$1" "$line"
  done
}

mkdir -p "$jobdir/ranks" || exit 97
case $mode in
  torchrun)
    NODE_RANK=${SLURM_NODEID:-0}
    export NODE_RANK
    code_file="$jobdir/ranks/node$NODE_RANK.exit_code"
    rm -f "$code_file"
    if ! command -v torchrun >/dev/null 2>&1; then
      echo "[$node] jupyter-remote-compute: torchrun is not on PATH on $node: install torch where the" \
        "nodes find it (or set PATH in the job's env), or use launcher plain"
      exit 127
    fi
    # c10d rendezvous at the first node; this node's rank is the one rendezvous gives (GROUP_RANK).
    {
      torchrun --nnodes="$NNODES" --nproc-per-node="$LOCAL_WORLD_SIZE" --rdzv-backend=c10d \
        --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv-id="jrc-${SLURM_JOB_ID:-0}" \
        --no-python sh "$jobdir/rank.sh" "$jobdir" worker 2>&1
      echo $? > "$code_file"
    } | prefixed "[$node] " "[$node rank "
    code=$(cat "$code_file" 2>/dev/null) || code=143 # no code: torchrun was killed
    exit "${code:-143}"
    ;;
  worker)
    NODE_RANK=${GROUP_RANK:-$NODE_RANK}
    ;;
  plain)
    RANK=$SLURM_PROCID
    LOCAL_RANK=$SLURM_LOCALID
    NODE_RANK=$SLURM_NODEID
    ;;
  *)
    echo "rank.sh: unknown mode $mode" >&2
    exit 2
    ;;
esac
export RANK LOCAL_RANK NODE_RANK
dir="$jobdir/ranks/$RANK"
mkdir -p "$dir" || exit 97
if [ "$RANK" != 0 ]; then
  MLFLOW_TRACKING_URI="file://$dir/mlruns"
  export MLFLOW_TRACKING_URI
fi
rm -f "$dir/exit_code"
printf '%s\n' "$node" > "$dir/node"
{
  sh "$jobdir/command.sh" 2>&1
  echo $? > "$dir/exit_code"
} | prefixed "[$node rank $RANK] " ""
code=$(cat "$dir/exit_code" 2>/dev/null) || code=143 # no code: the command was killed
exit "${code:-143}"
