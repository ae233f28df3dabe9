"""On a CUDA machine: does bf16 pay on the default config once kernel launches stop dominating?

The default config (bangla-small, batch 16, one-sentence comments of ~4-18 tokens) is host-bound
on a GPU: eager bf16 ran at 0.77x fp32 through the pipeline (profile_step.py). This times a bare
training step (forward, loss, backward, clip, fused AdamW) of the same model in fp32 and bf16,
eager, under torch.compile (dynamic shapes: batches padded to their longest row; static: padded to
32) and under torch.compile's "reduce-overhead" mode (CUDA graphs, static shapes), to see whether
cutting the launches would lift bf16 over fp32. Random weights and tokens: speed only.
    python benchmarks/bench_compile_gpu.py [--reps 2] [--modes eager,compile,reduce-overhead]
"""
import random
import time

import torch
from transformers import BertConfig, BertForSequenceClassification

from common import median, ratio, save

BATCH = 16
CONFIG = dict(vocab_size=4000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
              intermediate_size=1024, max_position_embeddings=512, num_labels=3)  # models.PRESETS["bangla-small"]


def batches(n: int, static: bool) -> list[tuple]:
    out = []
    for _ in range(n):
        width = 32 if static else random.randint(8, 18)
        ids = torch.randint(5, 4000, (BATCH, width))
        mask = torch.ones(BATCH, width, dtype=torch.long)
        for row in range(BATCH):
            length = random.randint(4, min(width, 18))
            mask[row, length:] = 0
            ids[row, length:] = 0
        out.append((ids.cuda(), mask.cuda(), torch.randint(0, 3, (BATCH,)).cuda()))
    return out


def one_run(precision: str, mode: str, static: bool, steps: int = 300, warmup: int = 30) -> dict:
    # a fresh compilation per run: past dynamo's recompile limit, later runs would silently run eager
    torch._dynamo.reset()
    torch.manual_seed(0)
    random.seed(0)
    model = BertForSequenceClassification(BertConfig(**CONFIG)).cuda().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    forward = model if mode == "eager" else torch.compile(
        model, mode=None if mode == "compile" else mode, dynamic=None if static else True)

    def step(ids, mask, labels):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = forward(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    data = batches(64, static)
    t0 = time.perf_counter()
    for i in range(warmup):
        step(*data[i % len(data)])
    torch.cuda.synchronize()
    warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(steps):
        step(*data[i % len(data)])
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    return {"samples_per_s": BATCH * steps / seconds, "ms_per_step": 1000 * seconds / steps, "warmup_s": warm}


def main():
    import argparse

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--modes", default="eager,compile,reduce-overhead")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_compile_gpu: needs a CUDA GPU")
    cells = [(mode, static) for mode in args.modes.split(",")
             for static in ((True,) if mode == "reduce-overhead" else (False, True))]
    runs = {f"{mode} {'static' if static else 'dynamic'} {precision}": [] for mode, static in cells
            for precision in ("fp32", "bf16")}
    for rep in range(args.reps):
        for mode, static in cells:
            for precision in ("fp32", "bf16"):  # a pair back to back: the ratio is per repetition
                name = f"{mode} {'static' if static else 'dynamic'} {precision}"
                runs[name].append(one_run(precision, mode, static))
                print(f"  rep {rep + 1}/{args.reps} {name}: {runs[name][-1]}", flush=True)
    rows = []
    for mode, static in cells:
        shape = "static" if static else "dynamic"
        fp32, bf16 = runs[f"{mode} {shape} fp32"], runs[f"{mode} {shape} bf16"]
        rows.append({"mode": mode, "shapes": shape, "fp32 samples/s": median(fp32, "samples_per_s"),
                     "bf16 samples/s": median(bf16, "samples_per_s"),
                     "bf16/fp32": ratio(bf16, fp32, "samples_per_s"),
                     "warm-up s (bf16)": median(bf16, "warmup_s")})
    save("compile", rows, list(rows[0]), {"batch": BATCH, "model": CONFIG, "steps": 300, "reps": args.reps}, runs)


if __name__ == "__main__":
    main()
