"""Fallback mode: a job asking for more processes than there are devices runs on the devices
there are, with the same global batch (gradient accumulation makes up the missing ranks), says
so in one warning line and in its tags; fallback=false refuses it (exit 2).

This machine has no GPU. PIPELINE_DEVICES (devices per node, a documented setting) stands in for
the GPU count, so the real launchers and the real CPU processes run the GPU-shaped cases: 8
processes asked of 1 device, 4 of 2.
"""

import pytest

from pipeline.config import load_config
from pipeline.errors import UserError
from pipeline.runtime import world
from pipeline.runtime.fallback import fit_to_world
from pipeline.runtime.world import Runtime


def runtime(world, requested=0):
    import torch

    return Runtime("torchrun", "ddp" if world > 1 else "single", 0, 0, world, 1, torch.device("cpu"), requested)


def test_grad_accum_makes_up_the_missing_ranks():
    cfg, rt = fit_to_world(load_config(None, ["train.grad_accum=2", "requested_world_size=8"]), runtime(2))
    assert cfg.train.grad_accum == 8 and rt.requested_world_size == 8 and rt.fallback
    # the written config describes the run as it ran: reusing it does not multiply again
    assert cfg.requested_world_size == 0
    again, rt2 = fit_to_world(cfg, runtime(2))
    assert again.train.grad_accum == 8 and not rt2.fallback
    shrunk_by_torchrun = fit_to_world(load_config(None, []), runtime(1, requested=4))
    assert shrunk_by_torchrun[0].train.grad_accum == 4 and shrunk_by_torchrun[1].requested_world_size == 4


@pytest.mark.parametrize("overrides, world, message", [
    (["requested_world_size=8", "fallback=false"], 1,
     "launch: requested_world_size=8 but 1 process(es) run and fallback=false: launch 8 processes on 8 devices"),
    (["requested_world_size=3"], 2,
     "launch: requested_world_size=3 but 2 process(es) run: 3 is not a multiple of 2, so gradient accumulation "
     "cannot keep the global batch"),
    (["requested_world_size=1"], 2,
     "launch: requested_world_size=1 but 2 process(es) run: launch at most 1 processes "
     "(or set requested_world_size=0)"),
])
def test_a_batch_that_cannot_be_kept_is_refused(overrides, world, message):
    with pytest.raises(UserError) as e:
        fit_to_world(load_config(None, overrides), runtime(world))
    assert str(e.value) == message


def torchrun_env(monkeypatch, local_rank, nproc, devices):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    monkeypatch.setenv(world.DEVICES_ENV, str(devices))
    for key, value in {"RANK": local_rank, "LOCAL_RANK": local_rank, "WORLD_SIZE": nproc,
                       "LOCAL_WORLD_SIZE": nproc}.items():
        monkeypatch.setenv(key, str(value))


def test_surplus_torchrun_ranks_leave_and_fallback_false_refuses(monkeypatch):
    """Without a process group: a rank beyond the devices returns None (it exits 0), and with
    fallback=false the launch is a one-line error."""
    torchrun_env(monkeypatch, local_rank=1, nproc=2, devices=1)
    assert world.init("auto", want_cuda=False) is None
    with pytest.raises(UserError, match=r"^launch: 2 processes per node but 1 device\(s\) visible \(fallback=false\)"):
        world.init("auto", want_cuda=False, fallback=False)
    monkeypatch.setenv(world.DEVICES_ENV, "two")
    with pytest.raises(UserError, match="^PIPELINE_DEVICES=two: must be a whole number >= 1$"):
        world.init("auto", want_cuda=False)
