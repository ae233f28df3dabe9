"""Who and where this process is: launcher, ranks, nodes, device; process-group set-up and
the few collectives the loop needs (all of them no-ops in a single process)."""
from __future__ import annotations

import contextlib
import datetime
import functools
import hashlib
import logging
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ParamSpec, TypeVar

import torch
import torch.distributed as dist

from pipeline.errors import UserError

log = logging.getLogger("pipeline")
T = TypeVar("T")
P = ParamSpec("P")

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
        _wait_released()
        dist.destroy_process_group()
    while _saved_env:
        key, value = _saved_env.popitem()
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def all_reduce(values: list[float], op: str = "sum") -> list[float]:
    """Reduce a few host scalars over all ranks (one collective for the whole list)."""
    if not dist.is_initialized():
        return list(values)
    t = _held(torch.tensor(values, dtype=torch.float64, device=_device()))
    dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op])
    return t.tolist()


@dataclass(frozen=True)
class Local:
    """A part's host figures for one collective, by name: summed over ranks, the largest or the
    smallest over ranks, or kept per rank. Every rank gives the same names (reduce_local checks)."""

    sums: dict[str, float] = field(default_factory=dict)
    maxes: dict[str, float] = field(default_factory=dict)
    mins: dict[str, float] = field(default_factory=dict)
    per_rank: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Reduced:
    """A Local's figures over every rank, by the same names."""

    sums: dict[str, float]
    maxes: dict[str, float]
    mins: dict[str, float]
    per_rank: list[dict[str, float]]
    """Each rank's per_rank figures, in rank order."""

    def part(self, name: str) -> Reduced:
        """The figures of the part join() named `name`, by their own names."""
        def own(figures: dict[str, float]) -> dict[str, float]:
            return {k.removeprefix(f"{name}:"): v for k, v in figures.items() if k.startswith(f"{name}:")}
        return Reduced(own(self.sums), own(self.maxes), own(self.mins), [own(rank) for rank in self.per_rank])


_OPS = ("sums", "maxes", "mins", "per_rank")


def join(**parts: Local) -> Local:
    """Several parts' Locals as one (one collective for all of them), each figure named
    `<part>:<name>`; Reduced.part takes a part's back."""
    def named(op: str) -> dict[str, float]:
        return {f"{part}:{k}": v for part, local in parts.items() for k, v in getattr(local, op).items()}
    return Local(*(named(op) for op in _OPS))


def reduce_local(local: Local) -> Reduced:
    """One collective: every rank's figures, each kind's names in sorted order, all-gathered as one
    tensor with a key of the names (ranks that name different figures fail here, not with wrong
    numbers), then summed, maxed, mined or kept per rank here. A Local without figures is no
    collective (ranks reach a log point in lockstep: all of them have none)."""
    layout = [(op, name) for op in _OPS for name in sorted(getattr(local, op))]
    if not layout:
        return Reduced({}, {}, {}, [{}])
    key = _names_key(layout)
    rows = _all_gather_rows([float(getattr(local, op)[name]) for op, name in layout] + [key])
    if any(row[-1] != key for row in rows):
        raise RuntimeError(f"ranks name different figures at one log point; this rank's: {layout}")
    columns = {(op, name): [row[j] for row in rows] for j, (op, name) in enumerate(layout)}

    def of(op: str, reduce: Callable[[list[float]], float]) -> dict[str, float]:
        return {name: reduce(column) for (kind, name), column in columns.items() if kind == op}
    return Reduced(of("sums", sum), of("maxes", max), of("mins", min),
                   [{name: row[j] for j, (op, name) in enumerate(layout) if op == "per_rank"} for row in rows])


def _names_key(layout: list[tuple[str, str]]) -> float:
    """The figures' kinds and names as a number a float64 holds exactly (48 bits of a digest)."""
    return float(int.from_bytes(hashlib.sha256(repr(layout).encode()).digest()[:6], "big"))


def _all_gather_rows(values: list[float]) -> list[list[float]]:
    """Every rank's list of host numbers (of one length), in rank order."""
    if not dist.is_initialized():
        return [list(values)]
    t = _held(torch.tensor(values, dtype=torch.float64, device=_device()))
    gathered = [_held(torch.empty_like(t)) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, t)
    return torch.stack(gathered).tolist()


def on_main(read: Callable[P, T]) -> Callable[P, T]:
    """A decorator: the function becomes a collective that runs on global rank 0 only (it reads
    files) and returns rank 0's answer on every rank; a UserError it raises is raised on every
    rank, so all of them fail with the same line (Lightning's rank_zero_only, with the answer
    shared)."""
    @functools.wraps(read)
    def collective(*args: P.args, **kwargs: P.kwargs) -> T:
        outcome: tuple[str | None, T | None] = (None, None)
        if not dist.is_initialized() or dist.get_rank() == 0:
            try:
                outcome = (None, read(*args, **kwargs))
            except UserError as e:
                outcome = (str(e), None)
        error, value = broadcast_object(outcome)
        if error is not None:
            raise UserError(error)
        return value
    return collective


def all_gather_objects(obj: T) -> list[T]:
    """Every rank's object (picklable), in rank order (a plain list of one in a single process)."""
    if not dist.is_initialized():
        return [obj]
    data = pickle.dumps(obj)
    sizes = [int(row[0]) for row in _all_gather_rows([len(data)])]
    mine = _held(torch.zeros(max(sizes), dtype=torch.uint8, device=_device()))
    mine[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    gathered = [_held(torch.empty_like(mine)) for _ in sizes]
    dist.all_gather(gathered, mine)
    return [pickle.loads(t[:size].cpu().numpy().tobytes()) for t, size in zip(gathered, sizes)]


def broadcast_object(obj: T) -> T:
    """Rank 0's object (picklable) on every rank."""
    if not dist.is_initialized():
        return obj
    data = pickle.dumps(obj) if dist.get_rank() == 0 else b""
    size = _held(torch.tensor([len(data)], dtype=torch.int64, device=_device()))
    dist.broadcast(size, src=0)
    box = _held(torch.empty(int(size.item()), dtype=torch.uint8, device=_device()))
    if data:
        box.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    dist.broadcast(box, src=0)
    return obj if data else pickle.loads(box.cpu().numpy().tobytes())


def _device() -> str:
    """Where a collective's tensors live: NCCL reduces on this rank's GPU, gloo on the host."""
    return f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"


_in_collectives: list[torch.Tensor] = []
"""The tensors of this process's latest collectives. The backend's worker thread lets go of a
finished collective (and its tensors) a moment after the caller's wait returns, and letting go
of a tensor Python knows needs the GIL: a worker that asks for it while the interpreter exits is
ended inside a C++ destructor, std::terminate, and the rank dies of SIGABRT after its work is
done (gloo's run loop; a rank that fails with a bad input right after a collective hits it).
shutdown() waits until the workers have let go of them."""


def _held(t: torch.Tensor) -> torch.Tensor:
    """`t`, kept until the backend's worker has let go of it (see _in_collectives)."""
    _in_collectives[:] = [kept for kept in _in_collectives if kept._use_count() > 1]
    _in_collectives.append(t)
    return t


def _wait_released(limit_s: float = 5.0) -> None:
    """Until no worker holds a collective's tensor (only this module's reference left: a few ms),
    or `limit_s` (a collective that never finished, a rank gone: the way out is not held up)."""
    deadline = time.monotonic() + limit_s
    while any(t._use_count() > 1 for t in _in_collectives):
        if time.monotonic() > deadline:
            log.debug("shutdown: a collective's tensors still held after %.0f s", limit_s)
            break
        time.sleep(0.001)
    _in_collectives.clear()


@contextlib.contextmanager
def on_sigterm(action: Callable[[], None]):
    """SIGTERM (Slurm time limit, spot preemption) calls `action` while the block runs (the loop's:
    set the flag it acts on at a step boundary, AgreedFlag; a study's: stop); the handler before
    it comes back after. Only the main thread receives signals: elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda *_: action())
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class AgreedFlag:
    """A host flag (SIGTERM seen) that every rank acts on at the same step without stalling the
    device: each poll starts an all-reduce (max) of this rank's flag and returns the result of the
    previous poll's, which has finished by then; so the ranks stop together, one step after the
    signal. In one process the flag itself is the answer, at once."""

    def __init__(self):
        self.raised = threading.Event()
        """Set on this rank (on_sigterm's handler); every rank acts on it at the same step."""
        self._pending: tuple | None = None

    def poll(self) -> bool:
        local = self.raised.is_set()
        if not torch.distributed.is_initialized():
            return local
        agreed = self._finish()
        self._start(local)
        return agreed

    def last_answer(self) -> bool:
        """Wait for the running all-reduce (before the loop stops polling); its answer."""
        return self._finish()

    def _start(self, local: bool) -> None:
        on_gpu = torch.distributed.get_backend() == "nccl"
        flag = torch.tensor([float(local)])
        if on_gpu:  # from pinned memory, no host wait; the answer comes back the same way
            flag = flag.pin_memory().to(f"cuda:{torch.cuda.current_device()}", non_blocking=True)
        work = torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, async_op=True)
        if not on_gpu:
            self._pending = (work, flag, None, flag)
            return
        work.wait()  # the current stream waits for it; the host does not
        _held(flag)
        answer = torch.empty(1, pin_memory=True)
        answer.copy_(flag, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        self._pending = (None, answer, done, flag)

    def _finish(self) -> bool:
        if self._pending is None:
            return False
        work, answer, done, flag = self._pending
        self._pending = None
        if work is not None:
            work.wait()
            _held(flag)  # waited for: shutdown waits until the backend lets go of it too
        if done is not None:
            done.synchronize()  # the previous step's work only: this step's stays queued
        return bool(answer.item())
