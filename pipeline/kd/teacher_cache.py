"""The teacher-logit cache: its key, the teacher pass dealt out across ranks, and the one file.

Every rank runs the teacher over its share of the training features, the shares are gathered
with collectives (so a cache directory local to each node works as well as a shared one), and
local rank 0 of each node writes the one file (write-then-rename; on shared storage the nodes
race harmlessly, the first rename wins). The shares are batches of similar length, longest
first, dealt so that they cost about the same; a 1-rank pass forms the same batches, so its
results are the same tensors.
"""
from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow.compute as pc
import torch
import torch.distributed as torch_dist
from safetensors.torch import save_file

from pipeline.fsutil import atomic_dir

if TYPE_CHECKING:
    import datasets
    from transformers import PreTrainedModel

    from pipeline.data.prepared import PreparedFeatures
    from pipeline.tasks.base import Task

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
GATHER_CHUNK_BYTES = 64 * 2**20
"""Bytes per rank per all_gather: the gathered cache never sits on a GPU all at once."""
DIGEST_CHUNK_ROWS = 65536
CONFIG_BOOKKEEPING = ("_name_or_path", "transformers_version", "dtype", "torch_dtype", "architectures")
"""Model config fields that do not change its outputs: a model moved or re-saved is the same."""


def computing_config(model: PreTrainedModel) -> dict:
    """The model's config without CONFIG_BOOKKEEPING: what its outputs depend on besides its weights."""
    return {k: v for k, v in model.config.to_dict().items() if k not in CONFIG_BOOKKEEPING}


def read_inputs(features: datasets.Dataset | PreparedFeatures) -> tuple[np.ndarray, bytes]:
    """(row lengths, a digest of every model-input column, row by row), read from Arrow a chunk at
    a time: a memory-mapped set of a million rows is never copied whole."""
    table = features.with_format("arrow")[:]
    names = [name for name in MODEL_INPUTS if name in table.column_names]
    digest, lengths = hashlib.sha256(), [np.zeros(0, np.int64)]
    for chunk in table.select(names).to_batches(max_chunksize=DIGEST_CHUNK_ROWS):
        for name in names:
            column = chunk.column(name)
            row_lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False).astype(np.int64)
            values = pc.list_flatten(column).to_numpy(zero_copy_only=False).astype(np.int64)
            for part in (name.encode(), row_lengths.tobytes(), values.tobytes()):
                digest.update(part)
            if name == "input_ids":
                lengths.append(row_lengths)
    return np.concatenate(lengths), digest.digest()


def cache_key(teacher: PreTrainedModel, task: Task, policy_name: str, max_length: int, inputs_digest: bytes) -> str:
    """What the teacher's outputs depend on: its weights and architecture, the task (which outputs,
    their width), the precision policy, and the token ids it reads (read_inputs' digest). Not the
    tokenizer object or where it was loaded from: the ids are what the teacher sees."""
    h = hashlib.sha256()
    h.update(f"{task.name}|{max_length}|{sorted(task.options.items())}|{policy_name}".encode())
    h.update(repr(sorted(computing_config(teacher).items())).encode())
    for name, tensor in sorted(teacher.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().float().cpu().numpy().tobytes())
    h.update(inputs_digest)
    return h.hexdigest()[:32]


def deal_batches(lengths: np.ndarray, batch_size: int, world: int) -> list[list[np.ndarray]]:
    """Each rank's batches (arrays of row numbers): rows sorted longest first (little padding) and
    cut into batches, each batch to the rank with the fewest padded tokens so far (longest
    processing time first), so the shares differ by less than one batch."""
    order = np.argsort(-lengths, kind="stable")
    shares: list[list[np.ndarray]] = [[] for _ in range(world)]
    tokens = [0] * world
    for start in range(0, len(order), batch_size):
        batch = order[start:start + batch_size]
        rank = min(range(world), key=lambda r: (tokens[r], r))
        shares[rank].append(batch)
        tokens[rank] += len(batch) * int(lengths[batch].max())
    return shares


def gather_shares(local: dict[str, torch.Tensor], shares: list[list[np.ndarray]], n_rows: int,
                  outputs: dict[str, tuple]) -> dict[str, torch.Tensor]:
    """The whole cache on every rank (CPU tensors, row i = feature i) from each rank's `local`
    rows (its batches in order). `outputs`: name -> trailing shape, the same on every rank."""
    rows = [torch.from_numpy(np.concatenate(b) if b else np.zeros(0, np.int64)) for b in shares]
    full = {name: torch.empty((n_rows, *shape), dtype=torch.float16) for name, shape in outputs.items()}
    if len(shares) == 1:
        for name, tensor in local.items():
            full[name][rows[0]] = tensor
        return full
    device = torch.device("cuda", torch.cuda.current_device()) if torch_dist.get_backend() == "nccl" else None
    most = max(len(r) for r in rows)
    for name, shape in outputs.items():
        mine = torch.zeros((most, *shape), dtype=torch.float16)
        if name in local:
            mine[: len(local[name])] = local[name]
        step = max(1, GATHER_CHUNK_BYTES // (2 * math.prod(shape)))
        for start in range(0, most, step):
            piece = mine[start:start + step].view(torch.uint8).to(device or "cpu")  # bytes: any backend, exact
            received = [torch.empty_like(piece) for _ in shares]
            torch_dist.all_gather(received, piece)
            for rank, got in enumerate(received):
                where = rows[rank][start:start + step]
                full[name][where] = got[: len(where)].cpu().view(torch.float16)
    return full


def write(path: Path, cache: dict[str, torch.Tensor]) -> None:
    """One safetensors file, renamed into place complete; a copy already there is kept."""
    with atomic_dir(path.parent) as tmp:
        save_file({k: v.contiguous() for k, v in cache.items()}, tmp / path.name)
