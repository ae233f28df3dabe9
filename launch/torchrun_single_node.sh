#!/usr/bin/env bash
# One node: one process per visible GPU, or NPROC CPU processes (gloo) on a machine without GPUs.
# Usage: launch/torchrun_single_node.sh [CONFIG.yaml] [key=value ...]
set -euo pipefail
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  NPROC=${NPROC:-$(nvidia-smi -L | wc -l)}
else
  NPROC=${NPROC:-2}
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}   # keep CPU ranks from oversubscribing the cores
fi
PYTHON=${PYTHON:-.venv/bin/python}
cmd=("$PYTHON" -m torch.distributed.run --standalone --nproc_per_node "$NPROC" -m pipeline train "$@")
echo "+ ${cmd[*]}"
exec "${cmd[@]}"
