#!/usr/bin/env bash
# One node: one process per visible GPU, or NPROC CPU processes (gloo) on a machine without GPUs.
# "Visible" is what torch sees: it honours CUDA_VISIBLE_DEVICES (Slurm, a shared node, MIG), which
# `nvidia-smi -L` (every physical GPU and MIG line) does not.
# Usage: launch/torchrun_single_node.sh [CONFIG.yaml] [key=value ...]
set -euo pipefail
PYTHON=${PYTHON:-.venv/bin/python}
GPUS=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())')
if [ "$GPUS" -gt 0 ]; then
  NPROC=${NPROC:-$GPUS}
  if [ "$NPROC" -gt "$GPUS" ]; then
    echo "error: launch: NPROC=$NPROC but only $GPUS GPU(s) are visible (CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset})" >&2
    exit 2
  fi
else
  NPROC=${NPROC:-2}
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}   # keep CPU ranks from oversubscribing the cores
fi
cmd=("$PYTHON" -m torch.distributed.run --standalone --nproc_per_node "$NPROC" -m pipeline train "$@")
echo "+ ${cmd[*]}"
exec "${cmd[@]}"
