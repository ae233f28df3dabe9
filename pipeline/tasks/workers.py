"""Worker processes for the per-row work of reading and tokenizing many rows: normalization,
QA's per-example validation (in_workers, a fork pool) and Task.map_batched (datasets' map)."""
from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from typing import Any

from normalizer import normalize

PARALLEL_ROWS = 20_000
"""From this many rows (texts) up, normalization and tokenization run in worker processes: the
normalizer does ~7k short comments/s on one core, so 20k rows are ~3 s of work against ~0.2 s to
fork workers and move the rows (datasets' map with num_proc also writes and joins shards: ~1 s);
below it, and for the built-in sample sets and tests, everything stays in-process."""


def worker_count(rows: int) -> int:
    """Worker processes for `rows` rows: 1 below PARALLEL_ROWS, else one per usable core (at
    most 8, and at most one per PARALLEL_ROWS rows)."""
    if rows < PARALLEL_ROWS:
        return 1
    return max(1, min(len(os.sched_getaffinity(0)), 8, rows // PARALLEL_ROWS))


def in_workers(function: Callable[..., Any], arguments: list[tuple]) -> list:
    """[function(*a) for a in arguments], in worker processes when they are many (PARALLEL_ROWS).
    An exception in a worker (a UserError naming a row) is raised here."""
    workers = worker_count(len(arguments))
    if workers == 1:
        return [function(*a) for a in arguments]
    # fork: the workers have the normalizer and the task already; only the arguments travel
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        return pool.starmap(function, arguments, chunksize=max(1000, len(arguments) // (workers * 8)))


def normalize_texts(texts: list[str]) -> list[str]:
    """normalizer.normalize of every text, in worker processes when they are many."""
    return in_workers(normalize, [(t,) for t in texts])
