"""The collectives the pipeline runs (all of them no-ops in a single process): a barrier, a few
host scalars reduced, objects gathered or broadcast (pickled into tensors), a function run on rank 0
with its answer shared, and the named-figures channel: a part's Figures summed, maxed, mined or
kept per rank in one all-gather (reduce_local). Every tensor a collective hands the
backend is kept until the backend lets go of it (held; wait_released before the group ends)."""
from __future__ import annotations

import functools
import hashlib
import logging
import pickle
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


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def all_reduce(values: list[float], op: str = "sum") -> list[float]:
    """Reduce a few host scalars over all ranks (one collective for the whole list)."""
    if not dist.is_initialized():
        return list(values)
    t = held(torch.tensor(values, dtype=torch.float64, device=_device()))
    dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op])
    return t.tolist()


@dataclass(frozen=True)
class Figures:
    """Host figures by name for one collective: summed over ranks, the largest or the smallest over
    ranks, or kept per rank (a dict a rank, in rank order). A rank's own have one dict in per_rank;
    reduce_local gives them back over every rank. Every rank gives the same names (reduce_local checks)."""

    sums: dict[str, float] = field(default_factory=dict)
    maxes: dict[str, float] = field(default_factory=dict)
    mins: dict[str, float] = field(default_factory=dict)
    per_rank: list[dict[str, float]] = field(default_factory=lambda: [{}])

    def part(self, name: str) -> Figures:
        """The figures of the part join() named `name`, by their own names."""
        def own(figures: dict[str, float]) -> dict[str, float]:
            return {k.removeprefix(f"{name}:"): v for k, v in figures.items() if k.startswith(f"{name}:")}
        return Figures(own(self.sums), own(self.maxes), own(self.mins), [own(rank) for rank in self.per_rank])


_OPS = ("sums", "maxes", "mins")


def join(**parts: Figures) -> Figures:
    """Several parts' figures as one (one collective for all of them), each named `<part>:<name>`;
    Figures.part takes a part's back."""
    def named(figures: dict[str, dict[str, float]]) -> dict[str, float]:
        return {f"{part}:{k}": v for part, own in figures.items() for k, v in own.items()}
    ranks = zip(*(figures.per_rank for figures in parts.values()), strict=True)
    return Figures(*(named({part: getattr(figures, op) for part, figures in parts.items()}) for op in _OPS),
                   [named(dict(zip(parts, rank))) for rank in ranks])


def reduce_local(local: Figures) -> Figures:
    """One collective: every rank's figures, each kind's names in sorted order, all-gathered as one
    tensor with a key of the names (ranks that name different figures fail here, not with wrong
    numbers), then summed, maxed, mined or kept per rank here. Figures without any are no
    collective (ranks reach a log point in lockstep: all of them have none)."""
    (mine,) = local.per_rank
    kinds = {**{op: getattr(local, op) for op in _OPS}, "per_rank": mine}
    layout = [(op, name) for op, figures in kinds.items() for name in sorted(figures)]
    if not layout:
        return Figures()
    key = _names_key(layout)
    rows = _all_gather_rows([float(kinds[op][name]) for op, name in layout] + [key])
    if any(row[-1] != key for row in rows):
        raise RuntimeError(f"ranks name different figures at one log point; this rank's: {layout}")
    columns = {(op, name): [row[j] for row in rows] for j, (op, name) in enumerate(layout)}

    def of(op: str, reduce: Callable[[list[float]], float]) -> dict[str, float]:
        return {name: reduce(column) for (kind, name), column in columns.items() if kind == op}
    return Figures(of("sums", sum), of("maxes", max), of("mins", min),
                   [{name: row[j] for j, (op, name) in enumerate(layout) if op == "per_rank"} for row in rows])


def _names_key(layout: list[tuple[str, str]]) -> float:
    """The figures' kinds and names as a number a float64 holds exactly (48 bits of a digest)."""
    return float(int.from_bytes(hashlib.sha256(repr(layout).encode()).digest()[:6], "big"))


def _all_gather_rows(values: list[float]) -> list[list[float]]:
    """Every rank's list of host numbers (of one length), in rank order."""
    if not dist.is_initialized():
        return [list(values)]
    t = held(torch.tensor(values, dtype=torch.float64, device=_device()))
    gathered = [held(torch.empty_like(t)) for _ in range(dist.get_world_size())]
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
    mine = held(torch.zeros(max(sizes), dtype=torch.uint8, device=_device()))
    mine[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    gathered = [held(torch.empty_like(mine)) for _ in sizes]
    dist.all_gather(gathered, mine)
    return [pickle.loads(t[:size].cpu().numpy().tobytes()) for t, size in zip(gathered, sizes)]


def broadcast_object(obj: T) -> T:
    """Rank 0's object (picklable) on every rank."""
    if not dist.is_initialized():
        return obj
    data = pickle.dumps(obj) if dist.get_rank() == 0 else b""
    size = held(torch.tensor([len(data)], dtype=torch.int64, device=_device()))
    dist.broadcast(size, src=0)
    box = held(torch.empty(int(size.item()), dtype=torch.uint8, device=_device()))
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
world.shutdown() waits until the workers have let go of them (wait_released)."""


def held(t: torch.Tensor) -> torch.Tensor:
    """`t`, kept until the backend's worker has let go of it (see _in_collectives): every tensor
    handed to a collective, here and in preemption.AgreedFlag."""
    _in_collectives[:] = [kept for kept in _in_collectives if kept._use_count() > 1]
    _in_collectives.append(t)
    return t


def wait_released(limit_s: float = 5.0) -> None:
    """Until no worker holds a collective's tensor (only this module's reference left: a few ms),
    or `limit_s` (a collective that never finished, a rank gone: the way out is not held up)."""
    deadline = time.monotonic() + limit_s
    while any(t._use_count() > 1 for t in _in_collectives):
        if time.monotonic() > deadline:
            log.debug("shutdown: a collective's tensors still held after %.0f s", limit_s)
            break
        time.sleep(0.001)
    _in_collectives.clear()
