#!/usr/bin/env bash
# One node: one process per visible GPU, or NPROC CPU processes (gloo) on a machine without GPUs.
# "Visible" is what torch sees: it honours CUDA_VISIBLE_DEVICES (Slurm, a shared node, MIG), which
# `nvidia-smi -L` (every physical GPU and MIG line) does not. NPROC above the visible GPUs falls
# back to one process per GPU with the same global batch (launch/devices.sh).
# Usage: [NPROC=N] launch/torchrun_single_node.sh [CONFIG.yaml] [key=value ...]
set -euo pipefail
PYTHON=${PYTHON:-.venv/bin/python}
source "$(dirname "$0")/devices.sh"
DEVICES=$(visible_devices)
if [ "$DEVICES" -gt 0 ]; then
  fit_nproc "${NPROC:-$DEVICES}" 1 "$@"
else
  fit_nproc "${NPROC:-2}" 1 "$@"
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}   # keep CPU ranks from oversubscribing the cores
fi
cmd=("$PYTHON" -m torch.distributed.run --standalone --nproc_per_node "$NPROC" -m pipeline train "$@" "${FALLBACK[@]}")
echo "+ ${cmd[*]}"
exec "${cmd[@]}"
