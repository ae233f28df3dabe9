#!/usr/bin/env bash
# One node under the deepspeed launcher: one process per visible GPU, or NPROC CPU processes
# (DeepSpeed's CPU accelerator with gloo). The launcher appends --local_rank=N; the CLI accepts it.
# Usage: DS_CONFIG=ds_configs/zero3.json launch/deepspeed_single_node.sh [CONFIG.yaml] [key=value ...]
set -euo pipefail
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  NPROC=${NPROC:-$(nvidia-smi -L | wc -l)}
else
  NPROC=${NPROC:-2}
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
fi
DEEPSPEED=${DEEPSPEED:-.venv/bin/deepspeed}
cmd=("$DEEPSPEED" --num_gpus "$NPROC" --module pipeline train "$@" "deepspeed=${DS_CONFIG:-ds_configs/zero2.json}")
echo "+ ${cmd[*]}"
exec "${cmd[@]}"
