"""Loaders of a stage: the resumable, rank-sharded training sampler (rows per batch, or a token
budget per batch) and the eval shards.

Every rank sees a disjoint slice of each epoch's permutation; the seed makes the permutation
identical across ranks and equal to a single process's. Loaders get their own generators so
that creating an iterator never draws from the global RNG (which drives dropout and must
continue exactly after a resume).
"""
from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterator, Sequence, Sized
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, DistributedSampler, Subset

from pipeline.config import DataConfig, TrainConfig
from pipeline.data.features import examples_digest, sequence_lengths
from pipeline.data.prepared import PreparedFeatures, TrainRows
from pipeline.runtime.world import Runtime
from pipeline.tasks import samples
from pipeline.tasks.readers import HUB_SPLIT

if TYPE_CHECKING:
    from pipeline.tasks.base import Collate, Task


class ResumableSampler(DistributedSampler):
    """DistributedSampler that can start an epoch part-way (after a resume) and, given the
    sequence lengths, groups similar lengths into the same global batch."""

    skip = 0

    def __init__(self, dataset: Sized, *, lengths: list[int] | None = None, batch_size: int = 1, **kwargs: Any):
        super().__init__(dataset, **kwargs)
        self.lengths, self.batch_size = lengths, batch_size

    def __iter__(self):
        if self.lengths is None:
            indices = list(super().__iter__())
        else:
            # global batches of similar lengths; rank r takes every world_size-th index, as
            # DistributedSampler does, so each rank's micro-batches hold similar lengths too
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = [i for batch in length_grouped_batches(self.lengths, self.batch_size * self.num_replicas,
                                                           generator) for i in batch]
            padding = self.total_size - len(order)
            order += (order * math.ceil(padding / len(order)))[:padding]
            indices = order[self.rank:self.total_size:self.num_replicas]
        return iter(indices[self.skip:])  # len() stays the whole epoch: the loop counts positions in it


MEGA_BATCH = 50
"""Length grouping sorts within chunks of this many batches: similar lengths meet in a batch,
while which rows share an epoch's part stays random."""


def sorted_mega_batches(lengths: Sequence[int], rows: int, generator: torch.Generator) -> Iterator[list[int]]:
    """A seeded permutation of the rows, cut into chunks of `rows`, each sorted by length,
    longest first."""
    order = torch.randperm(len(lengths), generator=generator).tolist()
    for start in range(0, len(order), rows):
        yield sorted(order[start:start + rows], key=lambda i: lengths[i], reverse=True)


def length_grouped_batches(lengths: Sequence[int], batch_size: int, generator: torch.Generator) -> list[list[int]]:
    """Batches of `batch_size` rows of similar length, in random order.

    Not the Trainer's get_length_grouped_indices: it keeps each mega-batch's batches longest to
    shortest, and when a mega-batch holds the whole epoch (the 1,500-row sample sets at batch 32)
    every epoch becomes a pass from the longest texts to the shortest, a curriculum that
    collapsed runs to one class. Here the batches are shuffled (as fairseq does), the longest
    one first (an out-of-memory error shows at the first step, as in the Trainer) and a short
    last batch last (every other batch stays whole for the ranks' and micro-batches' split)."""
    batches = [chunk[i:i + batch_size] for chunk in sorted_mega_batches(lengths, MEGA_BATCH * batch_size, generator)
               for i in range(0, len(chunk), batch_size)]
    short = [b for b in batches if len(b) < batch_size]
    full = [b for b in batches if len(b) == batch_size]
    full = [full[i] for i in torch.randperm(len(full), generator=generator).tolist()]
    if full:
        longest = max(range(len(full)), key=lambda i: lengths[full[i][0]])
        full.insert(0, full.pop(longest))
    return full + short


class TokenBatchSampler(torch.utils.data.Sampler):
    """Batches filled up to a token budget, as fairseq's max_tokens: a batch's padded size (its
    longest sequence x its rows) stays within `batch_tokens`, so short sequences travel in large
    batches and long ones in small batches, and little padding is computed.

    Each epoch: a seeded permutation, sorted by length within mega-batches (so batches hold
    similar lengths yet the epoch stays shuffled), packed greedily, the batches shuffled again and
    dealt round-robin to the ranks. Every rank gets the same number of batches (the last ones
    repeat batches from the start, as DistributedSampler pads), so collectives stay in step.
    Resumable: the first `skip` batches of this rank's epoch are left out; len() stays the whole
    epoch, as the loop counts positions in it.
    """

    def __init__(self, lengths: list[int], batch_tokens: int, *, num_replicas: int, rank: int, seed: int):
        self.lengths, self.batch_tokens = lengths, batch_tokens
        self.num_replicas, self.rank, self.seed = num_replicas, rank, seed
        self.epoch, self.skip = 0, 0
        self._cached: tuple[int, list[list[int]]] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def epoch_batches(self) -> list[list[int]]:
        """Every rank's batches of this epoch (the same list on every rank), before dealing."""
        if self._cached is not None and self._cached[0] == self.epoch:
            return self._cached[1]
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        mean_length = max(1, sum(self.lengths) // max(1, len(self.lengths)))
        mega = MEGA_BATCH * max(1, self.batch_tokens // mean_length)  # rows: about 50 batches' worth
        batches = []
        for chunk in sorted_mega_batches(self.lengths, mega, generator):
            batch: list[int] = []
            for i in chunk:  # descending: the batch's first row is its longest
                if batch and (len(batch) + 1) * self.lengths[batch[0]] > self.batch_tokens:
                    batches.append(batch)
                    batch = []
                batch.append(i)
            batches.append(batch)
        batches = [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]
        total = math.ceil(len(batches) / self.num_replicas) * self.num_replicas
        batches += (batches * math.ceil(total / len(batches)))[:total - len(batches)]
        self._cached = (self.epoch, batches)
        return batches

    def __iter__(self):
        mine = self.epoch_batches()[self.rank::self.num_replicas]
        return iter(mine[self.skip:])

    def __len__(self) -> int:
        return len(self.epoch_batches()) // self.num_replicas


IGNORED = -100
"""The target value a loss ignores (the Hugging Face heads' and torch's cross-entropy default)."""
TARGETS = ("labels", "start_positions", "end_positions")
"""The batch keys that hold training targets: a filler row's are IGNORED."""


def collate_shaped(features: list[dict], collate: Collate, multiple: int, max_length: int, pad_id: int,
                   rows: int | None = None) -> dict:
    """The task's collate, then the batch brought to one of a few shapes, so that compiled graphs
    (one per shape) and CUDA graphs (which replay one shape) are reused rather than rebuilt:

    - its length padded up to a multiple of `multiple`, at most max_length (the longest rows'
      bucket is max_length itself): input_ids with the pad token, per-token labels with IGNORED,
      masks and type ids with 0;
    - with `rows`, a short batch (the epoch's last) filled up to `rows` rows with copies of its
      first rows whose targets are IGNORED and whose idx is -1, so they carry no loss and no
      prediction. The losses are means over the targets that are not ignored (the models' own
      and the tasks'), so a filled batch's loss and gradients are the short batch's.

    Real rows come first; a batch's real rows are those with idx >= 0 (the meters count only them)."""
    batch = collate(features)
    length = batch["input_ids"].shape[1]
    bucket = min(-(-length // multiple) * multiple, max(length, max_length))
    if bucket > length:
        pad_values = {"input_ids": pad_id, "labels": IGNORED}
        batch = {k: torch.nn.functional.pad(v, (0, bucket - length), value=pad_values.get(k, 0))
                 if v.dim() == 2 and v.shape[1] == length else v for k, v in batch.items()}
    n = len(batch["idx"])
    if rows and n < rows:
        take = torch.arange(rows) % n
        batch = {k: v[take] for k, v in batch.items()}
        for key in (*TARGETS, "idx"):
            if key in batch:
                batch[key][n:] = -1 if key == "idx" else IGNORED
    return batch


def real_rows(idx: torch.Tensor) -> int:
    """The rows of a batch that are data, from its idx on the host (collate_shaped's filler rows,
    which come last, have idx -1)."""
    return int((idx >= 0).sum()) if len(idx) and idx[-1] < 0 else len(idx)


def shaped_collate(collate: Collate, train: TrainConfig, pad_id: int, rows: int | None = None) -> Collate:
    """`collate`, its batches shaped by collate_shaped where train.pad_to_multiple_of or `rows` ask for
    it (a partial: DataLoader workers pickle it)."""
    multiple = train.pad_to_multiple_of or 1
    if multiple == 1 and not rows:
        return collate
    return functools.partial(collate_shaped, collate=collate, multiple=multiple, max_length=train.max_length,
                             pad_id=pad_id, rows=rows)


def eval_shard(n: int, rt: Runtime) -> list[int]:
    """This rank's rows of an eval split: every rank gets the same number of rows (ZeRO-3 runs
    its forward passes in lockstep), the last ranks wrap around to rows already covered."""
    per_rank = math.ceil(n / rt.world_size)
    return [(rt.rank + rt.world_size * j) % n for j in range(per_rank)]


@dataclass
class Loaders:
    train: DataLoader
    sampler: ResumableSampler | TokenBatchSampler
    """The training loader's (batch) sampler: start_epoch() sets its epoch and what to skip."""
    dev: DataLoader | None
    """None: the job has no dev split (data.dev=skip)."""
    test: DataLoader | None
    """None: the job has no test split (data.test unset beside a given data key)."""

    def start_epoch(self, epoch: int, micro_batches_done: int) -> None:
        """Position the training loader at `epoch`, after this rank's micro-batches a resumed job did."""
        self.sampler.set_epoch(epoch)
        per_batch = 1 if isinstance(self.sampler, TokenBatchSampler) else self.train.batch_size
        self.sampler.skip = micro_batches_done * per_batch


def build_loaders(features: dict[str, PreparedFeatures], collate: Collate, train: TrainConfig, rt: Runtime, seed: int,
                  pad_id: int, fill: bool) -> Loaders:
    """The training loader (shuffled, sharded, resumable) and this rank's dev/test shards, their
    batches shaped by collate_shaped (lengths to train.pad_to_multiple_of; with `fill`, short
    batches filled to full rows: a compiled job). Workers (train.num_workers) stay between epochs."""
    grouped = train.group_by_length or train.batch_tokens
    lengths = sequence_lengths(features["train"]) if grouped else None
    pin = rt.device.type == "cuda"
    workers = {"num_workers": train.num_workers, "persistent_workers": train.num_workers > 0}

    def shape(rows: int | None) -> Collate:
        return shaped_collate(collate, train, pad_id, rows if fill else None)

    if train.batch_tokens:
        sampler = TokenBatchSampler(lengths, train.batch_tokens, num_replicas=rt.world_size, rank=rt.rank, seed=seed)
        # a token budget varies the rows per batch: no filling
        train_loader = DataLoader(features["train"], batch_sampler=sampler, collate_fn=shape(None), **workers,
                                  pin_memory=pin,
                                  generator=torch.Generator().manual_seed(seed))
    else:
        sampler = ResumableSampler(features["train"], num_replicas=rt.world_size, rank=rt.rank, shuffle=True,
                                   seed=seed, lengths=lengths,
                                   # groups of global batches: the same order however the global
                                   # batch is split into ranks and micro-batches (DDP/fallback parity)
                                   batch_size=train.batch_size * train.grad_accum)
        train_loader = DataLoader(features["train"], batch_size=train.batch_size, sampler=sampler,
                                  collate_fn=shape(train.batch_size), **workers, pin_memory=pin,
                                  generator=torch.Generator().manual_seed(seed))
    dev, test = (DataLoader(Subset(features[split], eval_shard(len(features[split]), rt)),
                            batch_size=train.eval_batch_size, collate_fn=shape(train.eval_batch_size),
                            pin_memory=pin,
                            generator=torch.Generator().manual_seed(seed)) if split in features else None
                 for split in ("dev", "test"))
    return Loaders(train_loader, sampler, dev, test)


def describe_datasets(data: DataConfig, task: Task, examples: dict[str, TrainRows | list[dict]]) -> list[dict]:
    """What data each split of the run saw, as MLflow records a dataset input (the journal's entry
    as written): split, name, source_type (local | hugging_face: MLflow's source types), source
    (JSON: {"uri": absolute path} for a file, {"path": id, "config_name", "split"} for the hub: where
    its rows came from, a file, a hub id or the built-in sample set), digest (sha256 of the examples
    as read, after validation, first 16 hex digits: equal data, equal digest) and rows."""
    from pipeline.tasks.base import SPLITS

    records = []
    for split in (split for split in SPLITS if split in examples):  # a split the job does not have: no record
        read_from = data.rows_from(split)  # a held-out dev split: rows of the training file
        spec = data.source(read_from)
        rows = examples[split]  # the prepared training split carries its digest (the same formula)
        digest = rows.digest if isinstance(rows, TrainRows) else examples_digest(rows)
        if spec and spec.startswith("hub:"):
            ident, _, config = spec[len("hub:"):].partition(":")
            name, source_type = spec[len("hub:"):], "hugging_face"
            source = {"path": ident, "config_name": config or None, "split": HUB_SPLIT[read_from]}
        else:
            path = Path(spec) if spec else samples.ensure_samples(task.name, task.write_samples)[read_from]
            name = path.name if spec else f"{task.name}-samples-v{samples.SAMPLE_VERSION}/{path.name}"
            source_type, source = "local", {"uri": str(path.resolve())}
        if read_from != split:
            name = f"{name} ({data.holdout_name()})"
        records.append({"split": split, "name": name, "source_type": source_type, "source": json.dumps(source),
                        "digest": digest, "rows": len(rows)})
    return records
