"""Token-budget batches (train.batch_tokens): every row once per epoch across ranks, each batch's
padded size within the budget, equal batch counts on every rank, seeded per epoch, resumable,
and a job trained with them reports the rows it really processed."""
import random

import pytest

from pipeline.config import load_config
from pipeline.data.loaders import TokenBatchSampler
from pipeline.errors import UserError

_rng = random.Random(0)
LENGTHS = [_rng.choice([8, 12, 20, 40, 64, 120]) for _ in range(500)]


def sampler(rank=0, world=1, budget=512, seed=3):
    return TokenBatchSampler(LENGTHS, budget, num_replicas=world, rank=rank, seed=seed)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_row_once_within_budget_and_equal_counts_per_rank(world):
    ranks = [sampler(rank, world) for rank in range(world)]
    batches = [list(s) for s in ranks]
    assert len({len(b) for b in batches}) == 1  # collectives stay in step
    assert all(len(b) == len(s) for b, s in zip(batches, ranks))
    seen = [i for rank_batches in batches for batch in rank_batches for i in batch]
    assert set(seen) == set(range(len(LENGTHS)))
    padding_repeats = len(seen) - len(LENGTHS)
    assert 0 <= padding_repeats and padding_repeats < max(len(b) for r in batches for b in r) * world
    for batch in (b for r in batches for b in r):
        assert len(batch) == 1 or max(LENGTHS[i] for i in batch) * len(batch) <= 512


def test_fewer_padded_tokens_than_fixed_rows_per_batch():
    token_batches = list(sampler())
    padded = sum(max(LENGTHS[i] for i in b) * len(b) for b in token_batches)
    rows = 16  # fixed batches in random order, the default
    order = random.Random(1).sample(range(len(LENGTHS)), len(LENGTHS))
    fixed = sum(max(LENGTHS[i] for i in order[k:k + rows]) * len(order[k:k + rows])
                for k in range(0, len(order), rows))
    assert padded < 0.7 * fixed


def test_seeded_per_epoch_and_resumable():
    a, b = sampler(), sampler()
    assert list(a) == list(b)
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first
    resumed = sampler()
    resumed.set_epoch(1)
    resumed.skip = 5
    assert list(resumed) == list(a)[5:] and len(resumed) == len(a)


def test_budget_smaller_than_max_length_is_refused():
    with pytest.raises(UserError, match=r"train.batch_tokens=40: must be 0 \(off\) or >= train.max_length \(48\)"):
        load_config(None, ["train.max_length=48", "train.batch_tokens=40"])
