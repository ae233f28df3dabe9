#!/usr/bin/env bash
# Several nodes with c10d rendezvous. Run this same script on every node with the same
# MASTER_ADDR (a host every node can reach) and MASTER_PORT, and NNODES nodes in total.
# One process per GPU that torch sees on this node (CUDA_VISIBLE_DEVICES honoured), 1 without GPUs;
# NPROC above the visible GPUs falls back to one per GPU with the same global batch (devices.sh).
# Usage: MASTER_ADDR=node0 NNODES=2 launch/torchrun_multi_node.sh [CONFIG.yaml] [key=value ...]
set -euo pipefail
: "${MASTER_ADDR:?set MASTER_ADDR to the rendezvous host}"
MASTER_PORT=${MASTER_PORT:-29500}
NNODES=${NNODES:-2}
PYTHON=${PYTHON:-.venv/bin/python}
source "$(dirname "$0")/devices.sh"
DEVICES=$(visible_devices)
fit_nproc "${NPROC:-$((DEVICES > 0 ? DEVICES : 1))}" "$NNODES" "$@"
cmd=("$PYTHON" -m torch.distributed.run --nnodes "$NNODES" --nproc_per_node "$NPROC"
     --rdzv_backend c10d --rdzv_endpoint "$MASTER_ADDR:$MASTER_PORT" --rdzv_id "${RDZV_ID:-pipeline}"
     --max-restarts "${MAX_RESTARTS:-1}" -m pipeline train "$@" "${FALLBACK[@]}" resume=auto)
echo "+ ${cmd[*]}"
exec "${cmd[@]}"
