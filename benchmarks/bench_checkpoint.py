"""The preemption budget: how long one checkpoint of a BERT-base-size model takes, through the
pipeline's own checkpoint.save (the backend's backend.pt with model + AdamW state, RNG state,
loop state, the sha256 manifest, the atomic rename) on this machine's disk.

torchrun's agent and the deepspeed launcher kill their workers about 30 s after forwarding
SIGTERM, so the step in flight, this save and the exit must fit in that window. Also timed alone:
torch.save of the same state (serialization + write) and sha256 of the written files, to see which
part dominates. Figures are medians over --reps saves.
    python benchmarks/bench_checkpoint.py [--reps 3] [--dir /path/on/the/job/disk]
"""
import argparse
import hashlib
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from common import WORK, quiet, save


def bert_base_with_adamw_state():
    """BERT-base (110M parameters) and an AdamW that has stepped once (exp_avg, exp_avg_sq exist)."""
    from transformers import BertConfig, BertForSequenceClassification

    from pipeline.runtime.precision import PrecisionPolicy
    from pipeline.runtime.torch_backend import TorchBackend
    from pipeline.runtime.world import Runtime

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(num_labels=3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    backend = TorchBackend(Runtime("none", "single", 0, 0, 1, 1, torch.device("cpu")), PrecisionPolicy("fp32", "cpu"),
                           max_grad_norm=1.0)
    backend.prepare(model, optimizer)
    batch = {"input_ids": torch.randint(5, 30000, (2, 16)), "labels": torch.tensor([0, 1])}
    backend.backward(model(**batch).loss)
    backend.step()
    return backend, sum(p.numel() for p in model.parameters())


def sha256_of(directory: Path) -> None:
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            digest = hashlib.sha256()
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def one_rep(backend, root: Path, rep: int) -> dict:
    from pipeline.job.parts import checkpoint
    from pipeline.layout import OutputDir

    out = root / f"rep{rep}"
    state = {"scheduler": {"last_epoch": 1}, "loop": {"step": rep}}
    seconds = timed(lambda: checkpoint.save(OutputDir(out), 100 + rep, state, 0, keep=1, write_backend=backend.save))
    path = checkpoint.latest(OutputDir(out)).path
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    alone = out / "torch_save_alone.pt"
    torch_save = timed(lambda: torch.save({"model": backend.module.state_dict(),
                                           "optimizer": backend.optimizer.state_dict()}, alone))
    alone.unlink()
    hashing = timed(lambda: sha256_of(path))
    return {"checkpoint_s": seconds, "torch_save_s": torch_save, "sha256_s": hashing, "size_mb": size / 2**20}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary folder)")
    args = parser.parse_args()
    quiet()
    backend, params = bert_base_with_adamw_state()
    root = Path(tempfile.mkdtemp(dir=args.dir or WORK, prefix="ckpt-"))
    try:
        runs = [one_rep(backend, root, rep) for rep in range(args.reps)]
    finally:
        shutil.rmtree(root, ignore_errors=True)  # 1.25 GB per repetition
    for run in runs:
        print("  " + ", ".join(f"{k}={v:.3g}" for k, v in run.items()), flush=True)
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    rows = [{"model": f"BERT-base ({params / 1e6:.0f}M params) + AdamW state", "checkpoint MB": med["size_mb"],
             "checkpoint.save s": med["checkpoint_s"], "torch.save alone s": med["torch_save_s"],
             "sha256 alone s": med["sha256_s"], "MB/s": med["size_mb"] / med["checkpoint_s"],
             "share of a 30 s kill window": med["checkpoint_s"] / 30}]
    save("checkpoint", rows, list(rows[0]), {**vars(args), "dir": str(root.parent)}, {"reps": runs})


if __name__ == "__main__":
    main()
