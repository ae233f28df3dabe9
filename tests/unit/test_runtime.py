"""Runtime paths that a GPU job takes, checked as far as a CPU can: the process group is bound to
the rank's GPU on an elastic restart too, and evaluation leaves nothing behind that the next
training step cannot use; the CLI's collector policy around set-up."""
import gc
import os

import pytest
import torch

from pipeline.errors import UserError
from pipeline.runtime import collectives, gc_pause, world


def test_process_group_gets_the_rank_gpu_on_first_start_and_after_elastic_restart(monkeypatch):
    """NCCL and GPUs are absent here: recording stand-ins replace torch.distributed's
    init_process_group and rendezvous, and the test checks what a GPU rank would pass them."""
    calls = []
    monkeypatch.setattr(world.dist, "init_process_group", lambda backend, **kw: calls.append((backend, kw)))
    monkeypatch.setattr(world.dist, "rendezvous", lambda url: iter([(world.dist.HashStore(), 3, 4)]))
    gpu = torch.device("cuda", 3)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    world.init_process_group(gpu, rank=3, world=4)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    world.init_process_group(gpu, rank=3, world=4)
    (first_backend, first), (restart_backend, restart) = calls
    assert first_backend == restart_backend == "nccl"
    assert first["device_id"] == restart["device_id"] == gpu
    assert restart["rank"] == 3 and restart["world_size"] == 4 and "store" in restart
    world.init_process_group(torch.device("cpu"), rank=3, world=4)
    assert calls[-1][0] == "gloo" and calls[-1][1]["device_id"] is None
    assert {kw["timeout"].total_seconds() for _, kw in calls} == {1800}  # dist_timeout's default


def test_dist_timeout_reaches_the_process_group(monkeypatch):
    calls = []
    monkeypatch.setattr(world.dist, "init_process_group", lambda backend, **kw: calls.append(kw))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    world.init_process_group(torch.device("cpu"), rank=0, world=2, timeout_s=7200)
    assert calls[0]["timeout"].total_seconds() == 7200


def test_ds_accelerator_cpu_keeps_deepspeed_workers_off_the_gpus_their_launcher_exposed(monkeypatch):
    """The deepspeed launcher sets CUDA_VISIBLE_DEVICES=0..N-1 for its workers whatever DeepSpeed's
    accelerator, so two CPU workers on a one-GPU machine see the GPU. DS_ACCELERATOR=cpu (DeepSpeed's
    switch) keeps the job on the CPU; without it the two ranks ask for one GPU and are refused (as on
    an H100). No GPU here: torch.cuda's answers and the process group's start are stand-ins."""
    started = []
    monkeypatch.setattr(world, "init_process_group", lambda device, *args, **kw: started.append(device))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.delenv(world.DEVICES_ENV, raising=False)
    for key, value in {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_SIZE": "2"}.items():
        monkeypatch.setenv(key, value)  # the deepspeed launcher's second worker
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    with pytest.raises(UserError, match="2 processes per node but 1 device"):
        world.init("deepspeed")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    rt = world.init("deepspeed")
    assert (rt.device, rt.rank, rt.world_size, started) == (torch.device("cpu"), 1, 2, [torch.device("cpu")])


def test_a_deepspeed_job_without_launcher_leaves_no_launcher_variables(monkeypatch):
    """init() sets RANK/WORLD_SIZE/... for DeepSpeed's one-process group; after shutdown() they are
    gone, so the next job in this process is not detected as a deepspeed-launched rank."""
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MASTER_PORT", "29555")
    monkeypatch.setattr(world, "init_process_group", lambda *a, **kw: None)  # no group needed to check the env
    rt = world.init("deepspeed", want_cuda=False)
    assert rt.backend == "deepspeed" and world.detect_launcher() == "deepspeed"
    world.shutdown()
    assert world.detect_launcher() == "none" and "RANK" not in os.environ
    assert os.environ["MASTER_PORT"] == "29555"  # the user's own value stays



def test_object_collectives_round_trip_and_shutdown_waits_for_the_backend_to_let_go():
    """all_gather_objects and broadcast_object over a real gloo group (one rank, its worker threads
    as in a job); gloo's worker lets go of a finished collective's tensors a moment after the
    caller's wait returns, and at interpreter exit that is a SIGABRT: after shutdown() no worker
    holds one. (tests/integration/test_features.py exits right after a collective on two ranks.)"""
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    try:
        objects = [None, {"error": "bad.tsv: line 3"}, ("x" * 100_000, [1.5, 2]), b"\x00" * 7]
        for obj in objects:
            assert collectives.all_gather_objects(obj) == [obj] and collectives.broadcast_object(obj) == obj
        for i in range(100):
            assert collectives.all_reduce([float(i), 1.0], "max") == [float(i), 1.0]
        used = list(collectives._in_collectives)
    finally:
        world.shutdown()
    assert used and all(t._use_count() == 1 for t in used) and not torch.distributed.is_initialized()

@pytest.fixture
def collector_restored():
    frozen = gc.get_freeze_count()
    gc.unfreeze()
    yield
    gc.unfreeze()
    if frozen:  # what tests/conftest.py froze after collection: walked by no collection again
        gc.freeze()
    gc.enable()


def test_set_up_runs_without_the_collector_and_the_loop_with_set_ups_objects_frozen(collector_restored):
    gc_pause.pause_for_setup(["study", "s.yaml"])  # a command other than a stage keeps it on
    assert gc.isenabled()
    gc_pause.pause_for_setup(["--local_rank=0", "train"])  # as `python -m pipeline` does before importing anything
    assert not gc.isenabled()
    made = [[] for _ in range(1000)]  # what set-up leaves alive
    gc_pause.resume_after_setup()
    assert gc.isenabled() and gc.get_freeze_count() >= len(made)  # walked by no collection
    frozen = gc.get_freeze_count()
    gc_pause.resume_after_setup()  # a second call (the next stage's) freezes nothing more
    # (the count can only fall meanwhile: a frozen object that another thread frees leaves it)
    assert gc.get_freeze_count() <= frozen


def test_a_caller_that_did_not_pause_the_collector_keeps_its_own_setting(collector_restored):
    gc_pause.resume_after_setup()  # run() called from a notebook or a test: collector on
    assert gc.isenabled() and gc.get_freeze_count() == 0
    gc.disable()  # a caller that turned it off itself
    gc_pause.resume_after_setup()
    assert not gc.isenabled() and gc.get_freeze_count() == 0
