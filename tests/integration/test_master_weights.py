"""precision=bf16-pure: the tests that train a model or start a process (the others are in
tests/unit/test_master_weights.py)."""
import pytest
import torch

from pipeline.runtime.torch_backend import TorchBackend
from pipeline.runtime.world import Runtime
from unit.test_master_weights import CPU, PURE, masters  # noqa: F401


def ddp_rank(rank: int, port: int, out: str) -> None:
    """One rank of a two-process gloo group: its own initial weights (seed = rank: the broadcast must
    fix them), half of each global batch, plain fused SGD (linear in the gradients)."""
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, fused=True)
    backend = TorchBackend(Runtime("torchrun", "ddp", rank, rank, 2, 1, torch.device("cpu")), PURE, max_grad_norm=0.0)
    backend.prepare(model, opt)
    start = [m.detach().clone() for m in masters(opt)]
    for seed in range(3):
        torch.manual_seed(100 + seed)
        x = torch.randn(8, 8).to(torch.bfloat16)[rank * 4:(rank + 1) * 4]
        backend.backward(backend.model(x).float().pow(2).mean())
        backend.step()
    torch.save({"start": start, "masters": [m.detach() for m in masters(opt)],
                "module": [p.detach() for p in backend.module.parameters()]}, f"{out}/rank{rank}.pt")
    torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_ddp_ranks_keep_identical_masters_and_match_one_process_on_the_global_batch(tmp_path):
    from helpers import free_port

    torch.multiprocessing.spawn(ddp_rank, args=(free_port(), str(tmp_path)), nprocs=2)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    assert all(torch.equal(a, b) for a, b in zip(r0["start"], r1["start"]))  # rank 0's masters, broadcast
    assert all(torch.equal(a, b) for a, b in zip(r0["masters"], r1["masters"]))
    assert all(torch.equal(a, b) for a, b in zip(r0["module"], r1["module"]))
    assert all(torch.equal(low, m.to(torch.bfloat16)) for low, m in zip(r0["module"], r0["masters"]))

    torch.manual_seed(0)  # one process on the whole global batch, from rank 0's weights
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, fused=True)
    backend = TorchBackend(CPU, PURE, max_grad_norm=0.0)
    backend.prepare(model, opt)
    for seed in range(3):
        torch.manual_seed(100 + seed)
        backend.backward(backend.model(torch.randn(8, 8).to(torch.bfloat16)).float().pow(2).mean())
        backend.step()
    for start, ddp, one in zip(r0["start"], r0["masters"], masters(opt)):
        # the same updates but for bf16 rounding of the gradients (all-reduced in bf16)
        torch.testing.assert_close(ddp - start, one.detach() - start, rtol=0.05, atol=2e-3)
    assert any((one.detach() - start).abs().max() > 2e-2 for start, one in zip(r0["start"], masters(opt)))


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="sized for a CUDA GPU: six 300-step jobs took 12 CPU-minutes "
                    "on a 2-core CPU; bf16-pure's CPU path runs end to end in test_train.py")
def test_bf16_pure_scores_like_autocast_bf16_over_seeds(tmp_path):
    """The whole job, three seeds each: bf16-pure's mean dev score within the autocast runs' spread
    (plus 0.02), its best/ weights fp32, its runs tagged pure16."""
    import json
    import statistics

    from helpers import FAST, mlflow_runs, run_cli, tracking_db

    scores = {}
    for name in ("bf16", "bf16-pure"):
        for seed in (0, 1, 2):
            out, db = tmp_path / f"{name}-{seed}", tracking_db(tmp_path, f"{name}-{seed}.db")
            result = run_cli("train", *FAST, "train.max_steps=300", f"precision={name}", f"seed={seed}",
                             f"output_dir={out}", f"tracking.uri=sqlite:///{db}", "tracking.experiment=bf16")
            assert result.returncode == 0, result.stderr[-3000:]
            scores.setdefault(name, []).append(json.loads((out / "metrics.json").read_text())["eval/main"])
            (run,) = mlflow_runs(db, "bf16")
            assert run.data.tags["precision_mode"] == ("pure16" if name == "bf16-pure" else "autocast")
            assert json.loads((out / "best" / "config.json").read_text())["dtype"] == "float32"
    spread = max(scores["bf16"]) - min(scores["bf16"])
    gap = abs(statistics.mean(scores["bf16-pure"]) - statistics.mean(scores["bf16"]))
    assert gap <= spread + 0.02, scores
