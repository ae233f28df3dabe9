"""The sentiment job end to end in one process: it learns, writes its outputs, lands in MLflow."""
import math

import pytest
import torch

from pipeline.config import load_config
from pipeline.errors import UserError
from pipeline.job.run import run


def test_missing_local_model_is_a_user_error(tmp_path):
    cfg = load_config(None, ["model=./no/such/model", f"output_dir={tmp_path / 'out'}"])
    with pytest.raises(UserError, match=r"^config: model=./no/such/model: no such directory$"):
        run(cfg)


def test_length_grouping_covers_the_epoch_once_and_cuts_padding():
    import random

    from pipeline.data.loaders import ResumableSampler

    rng = random.Random(0)
    lengths = [rng.randint(4, 120) for _ in range(403)]
    batch, world = 8, 2

    def padded_tokens(order):  # tokens a padded batch computes: batch size x its longest row
        batches = (order[j:j + batch] for j in range(0, len(order), batch))
        return sum(len(b) * max(lengths[i] for i in b) for b in batches)

    def epoch(grouped, epoch_number=0, skip=0):
        per_rank = []
        for rank in range(world):
            s = ResumableSampler(lengths, num_replicas=world, rank=rank, shuffle=True, seed=3,
                                 lengths=lengths if grouped else None, batch_size=batch)
            s.set_epoch(epoch_number)
            s.skip = skip
            per_rank.append(list(s))
        return per_rank

    grouped, plain = epoch(True), epoch(False)
    assert len(grouped[0]) == len(grouped[1]) == math.ceil(403 / world)
    assert set(grouped[0]) | set(grouped[1]) == set(range(403))  # every row, padded as DistributedSampler pads
    assert sum(map(padded_tokens, grouped)) < 0.7 * sum(map(padded_tokens, plain))
    assert epoch(True) == grouped and epoch(True, 1) != grouped  # seeded per epoch
    assert epoch(True, skip=16)[1] == grouped[1][16:]  # a resumed epoch continues the same order


def test_length_grouped_batches_come_in_random_order_longest_first():
    """403 rows at a global batch of 16 fit one mega-batch: the Trainer's grouping then walks the
    whole epoch from the longest batch to the shortest, a curriculum that collapsed short-data
    runs to one class; here only the first batch is chosen (the longest, so an out-of-memory
    error shows at once) and the rest come in a seeded random order."""
    import random

    from pipeline.data.loaders import length_grouped_batches

    rng = random.Random(0)
    lengths = [rng.randint(4, 120) for _ in range(403)]
    batches = length_grouped_batches(lengths, 16, torch.Generator().manual_seed(3))
    assert sorted(i for b in batches for i in b) == list(range(403))
    assert [len(b) for b in batches] == [16] * 25 + [3]  # the short batch last
    longest = [max(lengths[i] for i in b) for b in batches]
    assert longest[0] == max(lengths)
    spread = [max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches]
    assert max(spread) <= 12  # similar lengths together (random batches: ~100)
    ups = sum(b > a for a, b in zip(longest[1:-1], longest[2:-1]))
    assert 6 < ups < 18  # ~half the steps go up in a random order; longest-to-shortest has none
    assert batches == length_grouped_batches(lengths, 16, torch.Generator().manual_seed(3))
