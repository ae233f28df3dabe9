"""Loaders of a stage: the resumable, rank-sharded training sampler and the eval shards.

Every rank sees a disjoint slice of each epoch's permutation; the seed makes the permutation
identical across ranks and equal to a single process's. Loaders get their own generators so
that creating an iterator never draws from the global RNG (which drives dropout and must
continue exactly after a resume).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, DistributedSampler, Subset

from pipeline.config import TrainConfig
from pipeline.runtime.dist import Runtime


class ResumableSampler(DistributedSampler):
    """DistributedSampler that can start an epoch part-way (after a resume) and, given the
    sequence lengths, groups similar lengths into the same global batch."""

    skip = 0

    def __init__(self, dataset, *, lengths: list[int] | None = None, batch_size: int = 1, **kwargs):
        super().__init__(dataset, **kwargs)
        self.lengths, self.batch_size = lengths, batch_size

    def __iter__(self):
        if self.lengths is None:
            indices = list(super().__iter__())
        else:
            # Trainer's grouping over global batches; rank r takes every world_size-th index, as
            # DistributedSampler does, so each rank's micro-batch holds similar lengths too.
            # (Imported here: it pulls in the Trainer's helpers, which no other run needs.)
            from transformers.trainer_pt_utils import get_length_grouped_indices

            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = get_length_grouped_indices(self.lengths, self.batch_size * self.num_replicas,
                                               generator=generator)
            padding = self.total_size - len(order)
            order += (order * math.ceil(padding / len(order)))[:padding]
            indices = order[self.rank:self.total_size:self.num_replicas]
        return iter(indices[self.skip:])  # len() stays the whole epoch: the loop counts positions in it


def eval_shard(n: int, rt: Runtime) -> list[int]:
    """This rank's rows of an eval split: every rank gets the same number of rows (ZeRO-3 runs
    its forward passes in lockstep), the last ranks wrap around to rows already covered."""
    per_rank = math.ceil(n / rt.world_size)
    return [(rt.rank + rt.world_size * j) % n for j in range(per_rank)]


@dataclass
class Loaders:
    train: DataLoader
    sampler: ResumableSampler
    """The training loader's sampler: the loop sets its epoch and the batches to skip."""
    dev: DataLoader
    test: DataLoader


def build_loaders(features: dict, collate, train: TrainConfig, rt: Runtime, seed: int) -> Loaders:
    """The training loader (shuffled, sharded, resumable) and this rank's dev/test shards."""
    lengths = [len(ids) for ids in features["train"]["input_ids"]] if train.group_by_length else None
    sampler = ResumableSampler(features["train"], num_replicas=rt.world_size, rank=rt.rank, shuffle=True,
                               seed=seed, lengths=lengths, batch_size=train.batch_size)
    train_loader = DataLoader(features["train"], batch_size=train.batch_size, sampler=sampler, collate_fn=collate,
                              num_workers=train.num_workers, pin_memory=rt.device.type == "cuda",
                              generator=torch.Generator().manual_seed(seed))
    dev, test = (DataLoader(Subset(features[split], eval_shard(len(features[split]), rt)),
                            batch_size=train.eval_batch_size, collate_fn=collate,
                            generator=torch.Generator().manual_seed(seed))
                 for split in ("dev", "test"))
    return Loaders(train_loader, sampler, dev, test)
