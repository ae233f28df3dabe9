"""train.batch_size=auto: the largest micro-batch that fits, the global batch kept (grad_accum
raised), every rank agreeing on the smallest fit, evaluation's batch found on its own, a clean
refusal when one row does not fit; and the CPU's stand-in for a device's memory (tensors counted
against train.memory_limit_mb)."""

import pytest
import torch

from helpers import settled_config
from pipeline.config import load_config
from pipeline.errors import UserError
from pipeline.job import plan as settle
from pipeline.measure import batch_fit
from pipeline.measure.memory import MIB, TensorBytes
from pipeline.runtime import collectives
from pipeline.runtime.world import Runtime

CPU = Runtime("none", "single", 0, 0, 1, 1, torch.device("cpu"))


def linear_trial(standing_mb, per_row_mb, tried=None):
    """A stand-in for a training step on a device: its peak grows by per_row_mb a row."""
    def trial(rows, limit):
        if tried is not None:
            tried.append(rows)
        peak = int((standing_mb + per_row_mb * rows) * MIB)
        return None if peak > limit else peak
    return trial


def test_auto_settles_the_default_global_batch_and_resplit_keeps_it():
    cfg = load_config(None, ["train.batch_size=auto", "train.grad_accum=4"])
    assert cfg.train.batch_size == "auto"
    plan = settle.settle(cfg, "train", CPU)
    assert plan.find_batch and plan.cfg.train.batch_size == settle.AUTO_BATCH == 16
    assert plan.record.global_batch == "64 rows"  # 16 x grad_accum x world size, before any device is measured
    split = plan.resplit(8, 8, 256)
    assert (split.cfg.train.batch_size, split.cfg.train.grad_accum, split.cfg.train.eval_batch_size) == (8, 8, 256)
    assert split.record.config["train.grad_accum"] == 8 and split.record.global_batch == "64 rows"
    assert not split.find_batch
    with pytest.raises(ValueError, match="another global batch"):
        plan.resplit(8, 4, 64)
    with pytest.raises(ValueError, match="batch_size not settled"):
        settled_config(cfg, "preset:x", plan.task).train.__class__(
            **{**vars(plan.cfg.train), "batch_size": "auto"})


@pytest.mark.parametrize("overrides, fragment", [
    (["train.batch_size=aut"], "train.batch_size='aut': expected int"),
    (["train.batch_size=0"], "must be >= 1 or auto"),
    (["train.batch_size=auto", "train.batch_tokens=512"], "auto finds a number of rows"),
    (["train.memory_limit_mb=0"], "train.memory_limit_mb=0: must be >= 1"),
])
def test_bad_batch_settings_name_the_key(overrides, fragment):
    with pytest.raises(UserError, match=fragment.replace("(", r"\(")):
        load_config(None, overrides)


def test_the_largest_divisor_that_fits_under_the_margin_keeps_the_global_batch():
    tried = []
    # 100 MiB device, 90 usable: 10 + 3 x rows fits up to 26 rows; 64 rows per rank -> 16 x 4
    fit = batch_fit.find(64, 500, linear_trial(10, 3, tried), linear_trial(20, 0.1), 100 * MIB, "48 tokens")
    assert (fit.batch_size, fit.grad_accum) == (16, 4)
    assert fit.batch_size * fit.grad_accum == 64
    assert tried[0] == 64 and len(tried) <= 4  # the largest first, then a binary search of the divisors
    assert fit.peak_mb == pytest.approx(10 + 3 * 16)
    assert fit.eval_batch_size == 500  # the split's rows per rank: more would evaluate nothing


def test_a_batch_that_fits_whole_takes_one_trial_and_no_accumulation():
    tried = []
    fit = batch_fit.find(32, 100, linear_trial(1, 0.1, tried), linear_trial(1, 0.1), 100 * MIB, "48 tokens")
    assert (fit.batch_size, fit.grad_accum, tried) == (32, 1, [32])


def test_evaluation_is_found_on_its_own_and_never_shrinks_the_training_batch():
    # evaluation rows cost more than the device leaves: its batch is small, training's is not
    fit = batch_fit.find(16, 4096, linear_trial(10, 1), linear_trial(60, 7), 100 * MIB, "48 tokens")
    assert (fit.batch_size, fit.grad_accum) == (16, 1)
    assert fit.eval_batch_size == 4  # powers of two: 60 + 7 x 4 <= 90 < 60 + 7 x 8


def test_every_rank_agrees_on_the_smallest_fit_in_one_collective_per_trial(monkeypatch):
    """Another rank with less free memory, stood in for (no second process here; the torchrun test
    below runs two): its trials' outcomes come back through the all-reduce, the smallest fit wins."""
    last_rows, calls = [], []
    other = linear_trial(40, 3)  # the other rank: 40 MiB already used

    def trial(rows, limit):
        last_rows.append(rows)
        return linear_trial(10, 3)(rows, limit)

    def all_reduce(values, op="sum"):
        calls.append(values)
        theirs = other(last_rows[-1], 100 * MIB)
        mine_failed, mine_peak = values
        return [max(mine_failed, float(theirs is None or theirs > 90 * MIB)), max(mine_peak, float(theirs or 0))]

    monkeypatch.setattr(collectives, "all_reduce", all_reduce)
    fit = batch_fit.find(64, 1, trial, lambda rows, limit: 0, 100 * MIB, "48 tokens")
    assert fit.batch_size == 16 and fit.grad_accum == 4  # alone it would be 16 as well: 10 + 3 x 26 <= 90
    assert len(calls) == len(last_rows) + 1  # one per training trial, one for evaluation's
    monkeypatch.setattr(collectives, "all_reduce", all_reduce)
    last_rows.clear()
    other = linear_trial(70, 3)  # now the other rank fits only 6 rows: 4 wins (a divisor of 64)
    fit = batch_fit.find(64, 1, trial, lambda rows, limit: 0, 100 * MIB, "48 tokens")
    assert (fit.batch_size, fit.grad_accum) == (4, 16)


def test_ddp_keeps_its_gradient_buckets_beside_the_model_and_a_single_process_does_not():
    from pipeline.runtime.precision import PrecisionPolicy
    from pipeline.runtime.torch_backend import TorchBackend

    model = torch.nn.Linear(256, 256)
    frozen = torch.nn.Linear(256, 256).requires_grad_(False)
    both = torch.nn.Sequential(model, frozen)
    ddp = Runtime("torchrun", "ddp", 0, 0, 2, 1, torch.device("cpu"))
    assert TorchBackend(ddp, PrecisionPolicy("fp32", "cpu"), 1.0).standing_bytes(both) == (256 * 256 + 256) * 4
    assert TorchBackend(CPU, PrecisionPolicy("fp32", "cpu"), 1.0).standing_bytes(both) == 0


def test_one_row_that_does_not_fit_is_refused_naming_what_it_needs_and_what_there_is():
    with pytest.raises(UserError) as e:
        batch_fit.find(16, 100, linear_trial(150, 1), linear_trial(1, 1), 100 * MIB, "48 tokens")
    message = str(e.value)
    assert "one row of 48 tokens does not fit for training: it needs 151.0 MiB" in message
    assert "the device has 100.0 MiB (90.0 usable" in message


def test_the_cpu_counts_tensors_and_runs_out_past_the_cap():
    weights = torch.zeros(1024, 256)  # 1 MiB standing
    with TensorBytes([weights], 4 * MIB) as counter:
        a = torch.ones(512, 512)  # 1 MiB
        del a  # freed: no longer counted
        b = torch.ones(1024, 512)  # 2 MiB
        view = b[:10]  # a view: the same storage, nothing new
        assert counter.live == 3 * MIB
        with pytest.raises(torch.OutOfMemoryError, match="over the cap of 4 MiB"):
            torch.ones(1024, 1024)  # 4 MiB more
    assert counter.peak >= 3 * MIB and view.shape == (10, 512)
