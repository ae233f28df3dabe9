"""The launch scripts start one process per GPU that torch sees (CUDA_VISIBLE_DEVICES honoured),
and the deepspeed launcher is told which GPUs those are.

This machine has no GPU, so fakes on PATH stand in for the absent GPUs: `nvidia-smi -L` lists the
8 physical GPUs of a node; the fake `python -c ...` answers torch.cuda.device_count() as torch
does on that node (the entries of CUDA_VISIBLE_DEVICES when set, else 8) and otherwise prints the
argv it was given, as do the fake `deepspeed`, `srun` and `scontrol`; so each test asserts the
exact command a script would run.
"""
import os
import subprocess
import sys

import pytest

from helpers import ROOT

PHYSICAL_GPUS = 8
FAKE_NVIDIA_SMI = f"""#!/usr/bin/env bash
for i in $(seq 0 {PHYSICAL_GPUS - 1}); do echo "GPU $i: NVIDIA H100 80GB HBM3 (UUID: GPU-0000000$i)"; done
"""
FAKE_PYTHON = f"""#!/usr/bin/env bash
if [ "$1" = "-c" ]; then  # torch.cuda.device_count() on an {PHYSICAL_GPUS}-GPU node
  if [ -z "${{CUDA_VISIBLE_DEVICES+set}}" ]; then echo {PHYSICAL_GPUS}
  elif [ -z "$CUDA_VISIBLE_DEVICES" ]; then echo 0
  else echo "$CUDA_VISIBLE_DEVICES" | tr , '\\n' | wc -l; fi
  exit 0
fi
echo "RUN $(basename "$0") $*"
echo "OMP_NUM_THREADS=${{OMP_NUM_THREADS:-}}"
"""
FAKE_ARGV = """#!/usr/bin/env bash
echo "RUN $(basename "$0") $*"
echo "OMP_NUM_THREADS=${OMP_NUM_THREADS:-}"
echo "DS_ACCELERATOR=${DS_ACCELERATOR:-}"
"""
FAKE_SCONTROL = """#!/usr/bin/env bash
printf 'gpu-node-1\\ngpu-node-2\\n'
"""


@pytest.fixture
def fake_bin(tmp_path):
    """A bin directory with the stand-ins for a GPU node's tools."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in {"nvidia-smi": FAKE_NVIDIA_SMI, "python": FAKE_PYTHON, "deepspeed": FAKE_ARGV,
                       "srun": FAKE_ARGV, "scontrol": FAKE_SCONTROL}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def launch(script, fake_bin, *args, real_python=False, **env):
    """Run launch/SCRIPT with the fakes first on PATH; returns the CompletedProcess."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("CUDA_VISIBLE_DEVICES", "DS_ACCELERATOR", "NPROC", "OMP_NUM_THREADS")}
    full = {**base, "PATH": f"{fake_bin}:{os.environ['PATH']}", "DEEPSPEED": str(fake_bin / "deepspeed"),
            "PYTHON": sys.executable if real_python else str(fake_bin / "python"), **env}
    return subprocess.run(["bash", str(ROOT / "launch" / script), *args], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=120)


def ran(result) -> str:
    """The command the fake launcher received (its argv after its own name)."""
    assert result.returncode == 0, result.stderr
    (line,) = [l for l in result.stdout.splitlines() if l.startswith("RUN ")]
    return line.split(" ", 2)[2]


def test_torchrun_starts_one_process_per_visible_gpu(fake_bin):
    result = launch("torchrun_single_node.sh", fake_bin, "precision=bf16", CUDA_VISIBLE_DEVICES="2,5")
    assert ran(result) == ("-m torch.distributed.run --standalone --nproc_per_node 2 -m pipeline train "
                           "precision=bf16")
    assert "OMP_NUM_THREADS=\n" in result.stdout  # a GPU job keeps the user's threads
    everything = launch("torchrun_single_node.sh", fake_bin)  # no CUDA_VISIBLE_DEVICES: the whole node
    assert "--nproc_per_node 8 " in ran(everything)


def test_torchrun_multi_node_counts_visible_gpus(fake_bin):
    result = launch("torchrun_multi_node.sh", fake_bin, MASTER_ADDR="node0", NNODES="2", CUDA_VISIBLE_DEVICES="0,1,3")
    assert ran(result) == ("-m torch.distributed.run --nnodes 2 --nproc_per_node 3 --rdzv_backend c10d "
                           "--rdzv_endpoint node0:29500 --rdzv_id pipeline --max-restarts 1 -m pipeline train "
                           "resume=auto")


def test_deepspeed_launcher_is_given_the_visible_gpus(fake_bin):
    result = launch("deepspeed_single_node.sh", fake_bin, "precision=bf16", CUDA_VISIBLE_DEVICES="2,5")
    # --num_gpus 2 would make the launcher drop CUDA_VISIBLE_DEVICES and take GPUs 0 and 1
    assert ran(result) == ("--include localhost:2,5 --module pipeline train precision=bf16 "
                           "deepspeed=ds_configs/zero2.json")
    fewer = launch("deepspeed_single_node.sh", fake_bin, CUDA_VISIBLE_DEVICES="2,5", NPROC="1",
                   DS_CONFIG="ds_configs/zero3.json")
    assert ran(fewer) == "--include localhost:2 --module pipeline train deepspeed=ds_configs/zero3.json"
    whole_node = launch("deepspeed_single_node.sh", fake_bin)
    assert ran(whole_node) == "--num_gpus 8 --module pipeline train deepspeed=ds_configs/zero2.json"
    assert "DS_ACCELERATOR=\n" in whole_node.stdout  # DeepSpeed picks CUDA itself


def test_more_processes_than_visible_gpus_fall_back_with_the_same_global_batch(fake_bin):
    """8 asked, 1 visible: one process, told the world size its batch was planned for."""
    torchrun = launch("torchrun_single_node.sh", fake_bin, "precision=bf16", CUDA_VISIBLE_DEVICES="5", NPROC="8")
    assert ran(torchrun) == ("-m torch.distributed.run --standalone --nproc_per_node 1 -m pipeline train "
                             "precision=bf16 requested_world_size=8")
    assert torchrun.stderr.strip().splitlines() == [
        "warning: launch: NPROC=8 but only 1 device(s) visible (CUDA_VISIBLE_DEVICES=5): fallback to 1 process(es) "
        "per node, grad_accum keeps the global batch of 8"]
    ds = launch("deepspeed_single_node.sh", fake_bin, CUDA_VISIBLE_DEVICES="2,5", NPROC="4")
    assert ran(ds) == ("--include localhost:2,5 --module pipeline train requested_world_size=4 "
                       "deepspeed=ds_configs/zero2.json")
    nodes = launch("torchrun_multi_node.sh", fake_bin, MASTER_ADDR="node0", NNODES="2", CUDA_VISIBLE_DEVICES="0",
                   NPROC="4")
    assert " --nproc_per_node 1 " in ran(nodes) and ran(nodes).endswith("requested_world_size=8 resume=auto")
    own = launch("torchrun_single_node.sh", fake_bin, "requested_world_size=16", CUDA_VISIBLE_DEVICES="5", NPROC="8")
    assert ran(own).endswith("train requested_world_size=16")  # the user's own plan stands


@pytest.mark.parametrize("script", ["torchrun_single_node.sh", "deepspeed_single_node.sh"])
def test_fallback_false_keeps_the_one_line_refusal(fake_bin, script):
    result = launch(script, fake_bin, "fallback=false", CUDA_VISIBLE_DEVICES="2,5", NPROC="3")
    assert result.returncode == 2 and "RUN" not in result.stdout
    assert result.stderr.strip().splitlines() == [
        "error: launch: NPROC=3 but only 2 device(s) visible (CUDA_VISIBLE_DEVICES=2,5) and fallback=false"]


def test_deepspeed_refuses_gpu_uuids_it_cannot_include(fake_bin):
    result = launch("deepspeed_single_node.sh", fake_bin, CUDA_VISIBLE_DEVICES="GPU-00000002,GPU-00000005")
    assert result.returncode == 2 and "RUN" not in result.stdout
    (line,) = result.stderr.strip().splitlines()
    assert "CUDA_VISIBLE_DEVICES=GPU-00000002,GPU-00000005" in line and "GPU indices" in line


def test_no_visible_gpu_means_cpu_processes(fake_bin):
    result = launch("deepspeed_single_node.sh", fake_bin, CUDA_VISIBLE_DEVICES="")
    assert ran(result) == "--num_gpus 2 --module pipeline train deepspeed=ds_configs/zero2.json"
    assert "OMP_NUM_THREADS=1\n" in result.stdout
    # the launcher re-exposes GPUs 0..N-1 to its workers whatever its accelerator: CPU is said outright
    assert "DS_ACCELERATOR=cpu\n" in result.stdout


def test_slurm_script_reads_a_typed_gpus_per_node(fake_bin):
    result = launch("slurm_torchrun.sbatch", fake_bin, "precision=bf16", SLURM_JOB_NODELIST="gpu-node-[1-2]",
                    SLURM_NNODES="2", SLURM_GPUS_PER_NODE="h100:4", SLURM_JOB_ID="77")
    assert ran(result).split(" -m pipeline")[0].endswith(
        "-m torch.distributed.run --nnodes 2 --nproc_per_node 4 --rdzv_backend c10d "
        "--rdzv_endpoint gpu-node-1:29500 --rdzv_id 77 --max-restarts 1")
