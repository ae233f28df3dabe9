"""Who and where this process is: launcher, ranks, nodes, device, the backend it resolved to;
the process group's start (with fallback's shrink to the devices there are, and ranks sharing one
GPU over gloo) and end. What the rest of the pipeline needs to know of the backend it asks here
(Runtime.checkpoint_layout, resume_refusal), never its name."""
from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from pipeline.errors import UserError
from pipeline.runtime import collectives

log = logging.getLogger("pipeline")

DEVICES_ENV = "PIPELINE_DEVICES"
"""Devices per node the pipeline may use (an integer); unset: the GPUs torch sees, no limit on CPU."""
SHARE_GPU_ENV = "PIPELINE_SHARE_GPU"
"""Set to 1: a node's ranks share its visible GPUs (local rank modulo their count) over gloo, where
NCCL refuses two ranks on one device; no fallback. A check of the DDP path on one GPU, never a way to
train fast (benchmarks/gpu_check.py, ddp)."""


def shares_gpu() -> bool:
    return os.environ.get(SHARE_GPU_ENV, "") == "1"


@dataclass
class Runtime:
    launcher: str
    """none | torchrun | deepspeed: read from the environment the launcher sets."""
    backend: str
    """single | ddp | deepspeed: the resolved `backend` key."""
    rank: int
    local_rank: int
    world_size: int
    num_nodes: int
    device: torch.device
    requested_world_size: int = 0
    """The world size the job was planned for, when fallback runs fewer processes; 0 = world_size."""

    @property
    def fallback(self) -> bool:
        return self.requested_world_size > self.world_size

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1 or dist.is_initialized()

    @property
    def checkpoint_layout(self) -> str:
        """deepspeed | torch: whose checkpoint this backend writes (DeepSpeed's engine directory, or
        backend.pt), as a job's record keeps it (JobRecord.backend)."""
        return "deepspeed" if self.backend == "deepspeed" else "torch"


def resume_refusal(saved_layout: str, saved_world_size: int, layout: str, world_size: int) -> str | None:
    """Why a checkpoint of `saved_layout` written by `saved_world_size` processes cannot be resumed
    by a job that writes `layout` on `world_size` processes (Runtime.checkpoint_layout); None if it
    can. A torch checkpoint loads on any world size (the fallback shrinks it); a DeepSpeed one only
    on its own, as its ZeRO optimizer state is split among its ranks."""
    if saved_layout != layout:
        return (f"written by the {saved_layout} backend, asked to resume under {layout}; "
                f"resume with backend={saved_layout}, or resume=never starts over")
    if saved_layout == "deepspeed" and saved_world_size != world_size:
        return (f"a DeepSpeed checkpoint of {saved_world_size} processes (its ZeRO optimizer state "
                f"is split among them); launch {saved_world_size} processes to resume it")
    return None


def detect_launcher() -> str:
    if "TORCHELASTIC_RUN_ID" in os.environ:  # set by torchrun's elastic agent
        return "torchrun"
    if "WORLD_SIZE" in os.environ and "RANK" in os.environ:
        return "deepspeed"  # deepspeed's launcher sets the ranks but is not an elastic agent
    return "none"


def devices_per_node(want_cuda: bool = True) -> int | None:
    """How many processes a node can give a device each: $PIPELINE_DEVICES if set, else the GPUs
    torch sees (CUDA_VISIBLE_DEVICES honoured); None on a CPU-only machine (processes share the CPU)."""
    text = os.environ.get(DEVICES_ENV, "").strip()
    if text:
        if not text.isdigit() or int(text) < 1:
            raise UserError(f"{DEVICES_ENV}={text}: must be a whole number >= 1")
        return int(text)
    if want_cuda and torch.cuda.is_available():
        return torch.cuda.device_count()
    return None


def init(backend: str, want_cuda: bool = True, timeout_s: int = 1800, fallback: bool = True) -> Runtime | None:
    """Resolve `backend` against the launcher and start the process group if needed; a collective
    waits at most `timeout_s` for the other ranks. Under torchrun with more processes per node than
    devices, fallback keeps one process per device and returns None in the others (they have
    nothing to do and exit 0); without fallback that is a UserError."""
    launcher = detect_launcher()
    if os.environ.get("DS_ACCELERATOR") == "cpu" and "deepspeed" in (launcher, backend):
        # DeepSpeed's own switch for its CPU accelerator: the job's device must be DeepSpeed's, and
        # the deepspeed launcher sets CUDA_VISIBLE_DEVICES=0..N-1 for its workers whatever the
        # accelerator, so on a GPU machine the workers would otherwise see (and take) the GPUs
        want_cuda = False
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    # torchrun says LOCAL_WORLD_SIZE; the deepspeed launcher says LOCAL_SIZE
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("LOCAL_SIZE", str(world))))
    num_nodes = max(1, world // max(1, local_world))
    requested = 0
    devices = devices_per_node(want_cuda)
    if devices is not None and local_world > devices and not shares_gpu():
        if launcher != "torchrun" or not fallback:
            why = "fallback=false" if launcher == "torchrun" else f"the {launcher} launcher cannot shrink its group"
            raise UserError(f"launch: {local_world} processes per node but {devices} device(s) visible ({why}); "
                            "lower --nproc_per_node")
        if local_rank >= devices:
            log.warning("fallback: local rank %d has no device (%d visible): this process exits; the other "
                        "ranks keep the global batch with gradient accumulation", local_rank, devices)
            return None
        node = rank // local_world
        requested, rank, world = world, node * devices + local_rank, num_nodes * devices
        _set_env({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(devices)})

    backend = resolve_backend(backend, launcher, world)
    device = this_device(want_cuda, local_rank)
    if backend in ("ddp", "deepspeed") and not dist.is_initialized():
        init_process_group(device, rank, world, timeout_s, namespace="fallback" if requested else "")
    return Runtime(launcher, backend, rank, local_rank, world, num_nodes, device, requested)


def resolve_backend(backend: str, launcher: str, world: int) -> str:
    """The `backend` key against what the launcher started; combinations that cannot work refused."""
    if backend == "auto":
        backend = "deepspeed" if launcher == "deepspeed" else ("ddp" if world > 1 else "single")
    if backend == "single" and world > 1:
        raise UserError(f"backend=single: launched with {world} processes; use backend=ddp or auto")
    if backend == "ddp" and launcher == "none":
        raise UserError("backend=ddp: needs a launcher (torchrun --nproc_per_node N -m pipeline train ...)")
    if backend == "deepspeed" and launcher == "none":
        # DeepSpeed's engine needs a process group even for one process
        _set_env({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                  "MASTER_PORT": os.environ.get("MASTER_PORT", str(_free_port()))})
    return backend


def this_device(want_cuda: bool, local_rank: int) -> torch.device:
    """The local rank's GPU (made the current one), else the CPU."""
    if not (want_cuda and torch.cuda.is_available()):
        return torch.device("cpu")
    if shares_gpu():
        local_rank %= torch.cuda.device_count()
    if local_rank >= torch.cuda.device_count():
        raise UserError(f"launch: local rank {local_rank} but only {torch.cuda.device_count()} visible GPU(s); "
                        "lower --nproc_per_node")
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    return device


def init_process_group(device: torch.device, rank: int, world: int, timeout_s: int = 1800,
                       namespace: str = "") -> None:
    """NCCL bound to this rank's GPU (device_id: eager init, no guessing which GPU a rank uses), gloo on CPU
    and where ranks share a GPU (shares_gpu: gloo reduces CUDA tensors too, DDP's buckets among them).
    A `namespace` forms the group over the launcher's store under its own keys, with `rank` and
    `world` rather than the launcher's (the fallback's smaller group)."""
    kind = "nccl" if device.type == "cuda" and not shares_gpu() else "gloo"
    device_id = device if kind == "nccl" else None
    timeout = datetime.timedelta(seconds=timeout_s)
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if restart != "0" or namespace:
        # After an elastic restart the agent's store still holds the previous attempt's
        # addresses (a killed rank's port among them): namespace this attempt's keys.
        store, _, _ = next(dist.rendezvous("env://"))
        prefix = "/".join(part for part in ("pipeline", namespace, f"attempt_{restart}") if part)
        dist.init_process_group(kind, store=dist.PrefixStore(prefix, store),
                                rank=rank, world_size=world, device_id=device_id, timeout=timeout)
    else:
        dist.init_process_group(kind, device_id=device_id, timeout=timeout)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_saved_env: dict[str, str | None] = {}
"""The launcher variables init() set, with their values before: shutdown() puts them back, so a
later job in the same process (a notebook, a test) is not taken for a deepspeed-launched rank."""


def _set_env(values: dict[str, str]) -> None:
    for key, value in values.items():
        _saved_env.setdefault(key, os.environ.get(key))
        os.environ[key] = value


def shutdown() -> None:
    if dist.is_initialized():
        collectives.wait_released()  # a worker holding a tensor at exit is a SIGABRT (collectives)
        dist.destroy_process_group()
    while _saved_env:
        key, value = _saved_env.popitem()
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
