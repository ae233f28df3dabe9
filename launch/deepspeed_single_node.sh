#!/usr/bin/env bash
# One node under the deepspeed launcher: one process per visible GPU, or NPROC CPU processes
# (DeepSpeed's CPU accelerator, DS_ACCELERATOR=cpu, with gloo). The launcher appends
# --local_rank=N; the CLI accepts it.
# "Visible" is what torch sees (CUDA_VISIBLE_DEVICES honoured). The launcher itself drops
# CUDA_VISIBLE_DEVICES when given --num_gpus and would use GPUs 0..N-1, so with a visible set the
# GPUs are named with --include localhost:IDS (the first NPROC of them). NPROC above the visible
# GPUs falls back to one process per GPU with the same global batch (launch/devices.sh).
# Usage: DS_CONFIG=ds_configs/zero3.json launch/deepspeed_single_node.sh [CONFIG.yaml] [key=value ...]
set -euo pipefail
PYTHON=${PYTHON:-.venv/bin/python}
DEEPSPEED=${DEEPSPEED:-.venv/bin/deepspeed}
fail() { echo "error: launch: $*" >&2; exit 2; }
source "$(dirname "$0")/devices.sh"
DEVICES=$(visible_devices)
if [ "$DEVICES" -gt 0 ]; then
  fit_nproc "${NPROC:-$DEVICES}" 1 "$@"
  if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
    IFS=, read -ra ids <<< "$CUDA_VISIBLE_DEVICES"
    ids=("${ids[@]:0:$NPROC}")
    for id in "${ids[@]}"; do
      [[ "$id" =~ ^[0-9]+$ ]] || fail "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES: the deepspeed launcher takes GPU indices, not '$id'; use indices or launch/torchrun_single_node.sh"
    done
    resources=(--include "localhost:$(IFS=,; echo "${ids[*]}")")
  else
    resources=(--num_gpus "$NPROC")
  fi
else
  fit_nproc "${NPROC:-2}" 1 "$@"
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  # the launcher sets CUDA_VISIBLE_DEVICES=0..N-1 for its workers even on its CPU accelerator: on a
  # GPU machine whose GPUs are hidden (CUDA_VISIBLE_DEVICES=) they would see them again
  export DS_ACCELERATOR=${DS_ACCELERATOR:-cpu}
  resources=(--num_gpus "$NPROC")
fi
cmd=("$DEEPSPEED" "${resources[@]}" --module pipeline train "$@" "${FALLBACK[@]}" "deepspeed=${DS_CONFIG:-ds_configs/zero2.json}")
echo "+ ${cmd[*]}"
exec "${cmd[@]}"
