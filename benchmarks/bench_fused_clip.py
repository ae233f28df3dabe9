"""Clipping inside the fused AdamW step (TorchBackend.step: the clip divisor as the kernel's
grad_scale) against clip_grad_norm_'s own multiply pass before it, on BanglaBERT-size fp32
parameters and gradients (110M). Only the optimizer step is timed (norm, clip, fused AdamW), in wall
time and in the process's CPU time (which a shared machine's other jobs disturb less); both
contenders alternate, medians over repetitions, the ratio a median of per-repetition ratios.

    python benchmarks/bench_fused_clip.py --reps 7
    python benchmarks/bench_fused_clip.py --quick      # a tiny model (smoke run)
"""
from __future__ import annotations

import time

import torch
import transformers

from common import alternate, median, parser, ratio, save


def contender(folded: bool, model: torch.nn.Module, steps: int):
    from pipeline.runtime.torch_backend import clip_divisor

    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-5, fused=True)
    torch.manual_seed(0)
    grads = [torch.randn_like(p) for p in params]

    def run() -> dict:
        seconds = cpu_seconds = 0.0
        for _ in range(steps):
            for p, g in zip(params, grads):
                p.grad = g.clone()
            start, cpu_start = time.perf_counter(), time.process_time()
            if folded:
                optimizer.grad_scale = clip_divisor(torch.nn.utils.get_total_norm(grads), 1.0)
                optimizer.step()
                del optimizer.grad_scale
            else:
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimizer.step()
            seconds += time.perf_counter() - start
            cpu_seconds += time.process_time() - cpu_start
        return {"step_ms": 1000 * seconds / steps, "cpu_ms": 1000 * cpu_seconds / steps}

    return run


def main():
    p = parser(__doc__, reps=5)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    sizes = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                 vocab_size=32000)  # BanglaBERT's sizes (110M parameters)
    if args.quick:
        sizes = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256, vocab_size=500)
        args.reps, args.steps = 2, 2
    model = transformers.BertForSequenceClassification(transformers.BertConfig(**sizes, num_labels=3))
    runs = alternate({"separate clip pass": contender(False, model, args.steps),
                      "clip in the fused step": contender(True, model, args.steps)}, args.reps)
    separate = runs["separate clip pass"]
    rows = [{"contender": name, "step ms": median(r, "step_ms"), "speed vs separate": ratio(separate, r, "step_ms"),
             "CPU ms": median(r, "cpu_ms"), "CPU time vs separate": ratio(separate, r, "cpu_ms")}
            for name, r in runs.items()]
    save("fused-clip" + ("-quick" if args.quick else ""), rows, list(rows[0]), vars(args), runs)


if __name__ == "__main__":
    main()
