# Sourced by the launch scripts: how many processes this node starts, and the fallback.
#   fit_nproc WANTED NNODES ARGS...   sets NPROC and FALLBACK (extra key=value args, maybe none)
# Devices are $PIPELINE_DEVICES if set, else the GPUs torch sees (it honours CUDA_VISIBLE_DEVICES,
# which `nvidia-smi -L` does not); a CPU-only machine (0 GPUs) has no limit. Asking for more
# processes than devices runs one per device with requested_world_size=WANTED*NNODES: the pipeline
# multiplies grad_accum to keep the global batch, warns and tags the run fallback=true. An override
# fallback=false refuses instead (exit 2).
visible_devices() {
  if [ -n "${PIPELINE_DEVICES:-}" ]; then echo "$PIPELINE_DEVICES"
  else "$PYTHON" -c 'import torch; print(torch.cuda.device_count())'; fi
}

fit_nproc() {
  local wanted=$1 nnodes=$2 arg refuse="" own_request=""
  shift 2
  for arg in "$@"; do
    case "$arg" in
      fallback=false|fallback=no|fallback=0|fallback=off) refuse=1 ;;
      requested_world_size=*) own_request=1 ;;
    esac
  done
  NPROC=$wanted
  FALLBACK=()
  [ "$DEVICES" -gt 0 ] && [ "$wanted" -gt "$DEVICES" ] || return 0
  local seen="$DEVICES device(s) visible (CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset})"
  if [ -n "$refuse" ]; then
    echo "error: launch: NPROC=$wanted but only $seen and fallback=false" >&2
    exit 2
  fi
  echo "warning: launch: NPROC=$wanted but only $seen: fallback to $DEVICES process(es) per node, grad_accum keeps the global batch of $((wanted * nnodes))" >&2
  NPROC=$DEVICES
  [ -n "$own_request" ] || FALLBACK=("requested_world_size=$((wanted * nnodes))")
}
