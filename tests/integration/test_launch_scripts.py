"""The launch scripts start one process per GPU that torch sees (CUDA_VISIBLE_DEVICES honoured), and
the deepspeed launcher is told which GPUs those are: the tests that train a model or start a process
(the others are in tests/unit/test_launch_scripts.py)."""
import os

import pytest

from unit.test_launch_scripts import (  # noqa: F401
    FAKE_ARGV,
    FAKE_NVIDIA_SMI,
    FAKE_PYTHON,
    FAKE_SCONTROL,
    PHYSICAL_GPUS,
    fake_bin,
    launch,
    ran,
)


@pytest.mark.slow  # imports the real torch (seconds)
def test_gpu_count_comes_from_torch_not_nvidia_smi(fake_bin):
    """The real torch of the CPU suite sees no GPU (none here, or hidden by conftest on a GPU
    machine) even though the fake nvidia-smi lists 8."""
    result = launch("deepspeed_single_node.sh", fake_bin, real_python=True,
                    CUDA_VISIBLE_DEVICES=os.environ["CUDA_VISIBLE_DEVICES"])
    assert ran(result) == "--num_gpus 2 --module pipeline train deepspeed=ds_configs/zero2.json"
