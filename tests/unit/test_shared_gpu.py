"""PIPELINE_SHARE_GPU=1 (runtime/world.py): a node's ranks share its GPU over gloo, so one GPU can show the
DDP path (benchmarks/gpu_check.py's ddp check). No GPU here: torch.cuda's answers are stood in for (the
absent hardware), the device choice and the group's kind are what is checked."""
import pytest
import torch

from pipeline.errors import UserError
from pipeline.runtime import world


@pytest.fixture
def one_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    kinds = []
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda kind, **kw: kinds.append((kind, kw)))
    return kinds


def test_without_sharing_a_second_rank_has_no_gpu_and_the_group_is_nccl(one_gpu, monkeypatch):
    monkeypatch.delenv(world.SHARE_GPU_ENV, raising=False)
    with pytest.raises(UserError, match="local rank 1 but only 1 visible GPU"):
        world.this_device(True, 1)
    world.init_process_group(torch.device("cuda", 0), 0, 2)
    assert one_gpu[-1][0] == "nccl" and one_gpu[-1][1]["device_id"] == torch.device("cuda", 0)


def test_sharing_puts_both_ranks_on_the_one_gpu_over_gloo(one_gpu, monkeypatch):
    monkeypatch.setenv(world.SHARE_GPU_ENV, "1")
    assert world.this_device(True, 0) == world.this_device(True, 1) == torch.device("cuda", 0)
    world.init_process_group(torch.device("cuda", 0), 1, 2)
    assert one_gpu[-1][0] == "gloo" and one_gpu[-1][1]["device_id"] is None
