#!/usr/bin/env bash
# Several nodes under the deepspeed launcher (passwordless ssh from this node to the others).
# HOSTFILE lines look like "node0 slots=4"; the first host runs the rendezvous.
# Usage: HOSTFILE=hosts DS_CONFIG=ds_configs/zero3.json launch/deepspeed_hostfile.sh [CONFIG.yaml] [key=value ...]
set -euo pipefail
: "${HOSTFILE:?set HOSTFILE to a DeepSpeed hostfile}"
MASTER_ADDR=${MASTER_ADDR:-$(awk 'NF && $1 !~ /^#/ {print $1; exit}' "$HOSTFILE")}
DEEPSPEED=${DEEPSPEED:-.venv/bin/deepspeed}
cmd=("$DEEPSPEED" --hostfile "$HOSTFILE" --master_addr "$MASTER_ADDR" --master_port "${MASTER_PORT:-29500}"
     --module pipeline train "$@" "deepspeed=${DS_CONFIG:-ds_configs/zero2.json}" resume=auto)
echo "+ ${cmd[*]}"
exec "${cmd[@]}"
