"""train.compile and the few batch shapes it needs: the tests that train a model or start a process
(the others are in tests/unit/test_compile.py)."""

import pytest
import torch

from pipeline.runtime import compiler
from unit.test_compile import CPU, TINY, backend_for, batches, gloo_group, losses, tiny_classifier  # noqa: F401


@pytest.mark.slow
def test_compiled_steps_agree_with_eager_and_checkpoints_move_between_them(tmp_path, gloo_group):
    """4 steps of a tiny BERT (no dropout), fp32, compiled (inductor) and eager from the same weights
    and batches, alone and inside DDP (its gradient hooks on what the compiled backward produces):
    losses within 1e-4 relative (fused kernels reorder float sums); a compiled job's checkpoint
    loads into an eager one and the reverse, keys without `_orig_mod.`."""
    torch._dynamo.reset()
    data = batches()
    eager, compiled = backend_for(tiny_classifier(), "off"), backend_for(tiny_classifier(), "default")
    expected, got = losses(eager, data), losses(compiled, data)
    assert got == pytest.approx(expected, rel=1e-4)
    assert compiler.compiles() >= 1  # it really compiled
    under_ddp = backend_for(tiny_classifier(), "default", gloo_group)
    assert isinstance(under_ddp.model, torch.nn.parallel.DistributedDataParallel)
    assert losses(under_ddp, data) == pytest.approx(expected, rel=1e-4)

    keys = set(tiny_classifier().state_dict())
    assert set(compiled.full_state_dict()) == keys
    compiled.save(tmp_path, rank=0)
    resumed = backend_for(tiny_classifier(seed=1), "off")
    resumed.load(tmp_path)
    assert all(torch.equal(v, compiled.full_state_dict()[k]) for k, v in resumed.full_state_dict().items())
    (tmp_path / "eager").mkdir()
    eager.save(tmp_path / "eager", rank=0)
    back = backend_for(tiny_classifier(seed=1), "default")
    back.load(tmp_path / "eager")
    assert set(back.module.state_dict()) == keys
    assert losses(back, data[:1]) == pytest.approx(losses(eager, data[:1]), rel=1e-4)  # the same next step
