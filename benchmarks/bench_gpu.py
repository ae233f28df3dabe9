"""The paper's table on a GPU: the real architectures built from config with random weights
(speed and memory do not depend on the weights), strict fp32 (TF32 off), tf32, fp16 and bf16
autocast, batch 16, 32, 64, sequence 128 and 256: samples/s, peak memory, TFLOP/s and MFU,
energy per sample and mean power. `make bench-gpu` runs it; results/gpu-MACHINE-DATE.json names the GPU.

The step is the pipeline's: its PrecisionPolicy (autocast, matmul mode) and TorchBackend
(GradScaler for fp16, unscale, clipping, skipped-step detection), AdamW on fp32 master weights.
Each cell builds its model fresh after resetting the allocator's peak, so peak memory counts
weights, gradients, optimizer state and activations of that cell alone. FLOPs are counted on one
step outside the timed window (FlopCounterMode), then warm-up steps, then one timed window.

The window is long enough to resolve energy: NVML's total-energy counter (mJ since the driver
loaded) advances with the board's power sensor, which recent GPUs refresh every ~20-100 ms, so
each cell runs for at least --seconds (default 10 s: the counter's edges then cost <= ~1-2%) with
the number of steps set from a timed calibration, and the clock and the counter are read at the
same two synchronized points. Precisions alternate within each (model, batch, length) for --reps
rounds; figures are medians.
Targets on H100-class GPUs: AMP >= 3x strict fp32 throughput, >= 30% less peak memory at the same
batch, bf16 MFU >= 40%. (The paper: +44.5% speed, -17.6% memory on an RTX 4070.)
With --compile MODES (eager,default,reduce-overhead,max-autotune) each cell also runs with the
model compiled as train.compile does it (pipeline.runtime.compiler: in place, static shapes), after
warm-up steps that compile and record outside the window; the compile time is reported apart.
--profile adds, per cell, a torch.profiler trace of --profile-steps steps after the window: wall
time per step vs GPU-busy time (the sum of kernel times), and kernel time split into matmul,
attention, element-wise/other and idle (wall minus busy).
    python benchmarks/bench_gpu.py [--models banglabert,xlmr,mbert] [--reps 2] [--seconds 10]
    python benchmarks/bench_gpu.py --models banglabert --precisions fp32,bf16 --compile eager,reduce-overhead --profile
    python benchmarks/bench_gpu.py --quick   # a tiny CPU smoke run of the same code
"""
import argparse
import gc
import math
import statistics
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from common import markdown_table, quiet, save

ARCHS = {  # the checkpoints' config.json values that decide speed and memory
    "banglabert": ("electra", dict(vocab_size=32000, embedding_size=768, hidden_size=768, num_hidden_layers=12,
                                   num_attention_heads=12, intermediate_size=3072, max_position_embeddings=512)),
    "xlmr": ("xlm-roberta", dict(vocab_size=250002, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                 intermediate_size=3072, max_position_embeddings=514, type_vocab_size=1,
                                 pad_token_id=1)),
    "mbert": ("bert", dict(vocab_size=119547, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                           intermediate_size=3072, max_position_embeddings=512)),
    "tiny": ("bert", dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                          intermediate_size=128, max_position_embeddings=512)),  # --quick only
}
NAMES = {"banglabert": "BanglaBERT (ELECTRA-base)", "xlmr": "XLM-R base", "mbert": "mBERT (cased)", "tiny": "tiny"}
WARMUP_STEPS = 3  # cuBLAS heuristics, the allocator, the fused AdamW's first step
COMPILE_WARMUP_STEPS = 5  # compile, then CUDA graphs' warm-up and recording runs (reduce-overhead)
KERNEL_KINDS = (  # (kind, substrings of a CUDA kernel's name), first match wins
    ("attention", ("flash", "fmha", "attention", "sdpa", "_efficient_attention")),
    ("matmul", ("gemm", "cutlass", "cublas", "xmma", "nvjet", "matmul", "sm90_", "sm80_", "mm_")),
)
MAX_STEPS = 100_000


def build(arch: str, device):
    from transformers import AutoConfig, AutoModelForSequenceClassification

    model_type, sizes = ARCHS[arch]
    config = AutoConfig.for_model(model_type, num_labels=3, **sizes)
    return AutoModelForSequenceClassification.from_config(config, attn_implementation="sdpa",
                                                          dtype=torch.float32).to(device)


def steps_for(step, seconds: float, device, min_steps: int) -> int:
    """Steps that fill `seconds`, from a synchronized timing of a few warm-up steps; the timed window
    then runs that many steps with no clock reads or syncs of the benchmark's own in between."""
    from pipeline.measure import telemetry

    telemetry.synchronize(device)
    start = time.perf_counter()
    for _ in range(WARMUP_STEPS):
        step()
    telemetry.synchronize(device)
    per_step = (time.perf_counter() - start) / WARMUP_STEPS
    return max(min_steps, min(MAX_STEPS, math.ceil(seconds / per_step)))


def kernel_kind(name: str) -> str:
    lower = name.lower()
    return next((kind for kind, keys in KERNEL_KINDS if any(k in lower for k in keys)), "element-wise/other")


def profile_steps(step, steps: int, device) -> dict:
    """Per step: wall ms, GPU-busy ms (kernel time) and kernel ms by kind, from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    from pipeline.measure import telemetry

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    telemetry.synchronize(device)
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        telemetry.synchronize(device)
        wall = time.perf_counter() - start
    kinds: dict[str, float] = {}
    kernels: dict[str, float] = {}
    for event in prof.events():
        # kernels only: a user annotation's range (e.g. Optimizer.step#AdamW.step) spans kernels counted already
        if (event.device_type == torch.autograd.DeviceType.CUDA and event.device_time > 0
                and not getattr(event, "is_user_annotation", False) and "#" not in event.name):
            kind = kernel_kind(event.name)
            kinds[kind] = kinds.get(kind, 0.0) + event.device_time / 1000  # us -> ms
            kernels[event.name] = kernels.get(event.name, 0.0) + event.device_time / 1000
    busy = sum(kinds.values())
    wall_ms = wall * 1000
    out = {"wall_ms": wall_ms / steps, "gpu_busy_ms": busy / steps, "busy_share": busy / wall_ms if wall_ms else None}
    for kind in ("matmul", "attention", "element-wise/other"):
        out[f"{kind}_ms"] = kinds.get(kind, 0.0) / steps
    out["idle_ms"] = max(0.0, wall_ms - busy) / steps
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:12]  # in the JSON: what "other" is made of
    out["top_kernels_ms"] = {name[:120]: ms / steps for name, ms in top}
    return out


def cell(arch, precision_name, batch, length, seconds, min_steps, device, mode="eager", profile=0) -> dict:
    from pipeline.measure import telemetry
    from pipeline.measure.energy import EnergyMeter
    from pipeline.runtime import compiler, precision
    from pipeline.runtime.dist import Runtime
    from pipeline.runtime.torch_backend import TorchBackend

    torch._dynamo.reset()  # a fresh compilation per cell: cached graphs of another cell would be reused
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    telemetry.reset_peak_memory(device)
    policy = precision.resolve(precision_name, device)
    policy.apply_matmul_mode()  # strict fp32 (TF32 off) or tf32, process-wide, as a stage applies it
    torch.manual_seed(0)
    model = build(arch, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    backend = TorchBackend(Runtime("none", "single", 0, 0, 1, 1, device), policy, max_grad_norm=1.0)
    backend.prepare(model, optimizer)
    vocab = model.config.vocab_size
    inputs = {"input_ids": torch.randint(5, vocab, (batch, length), device=device),
              "attention_mask": torch.ones(batch, length, dtype=torch.long, device=device),
              "labels": torch.randint(0, 3, (batch,), device=device)}

    def step():
        if mode in ("reduce-overhead", "max-autotune"):  # both replay CUDA graphs
            torch.compiler.cudagraph_mark_step_begin()
        with policy.autocast():
            loss = model(**inputs).loss
        backend.backward(loss)
        return backend.step()

    counter = FlopCounterMode(display=False)
    with counter:
        step()
    flops = counter.get_total_flops()  # forward + backward of one step, outside the timed window (eager)
    compile_s = None
    if mode != "eager":
        compiler.compile_module(model, "default" if mode == "compile" else mode)
        before = compiler.compile_seconds()
        telemetry.synchronize(device)
        for _ in range(COMPILE_WARMUP_STEPS):
            step()
        telemetry.synchronize(device)
        compile_s = compiler.compile_seconds() - before
    steps = steps_for(step, seconds, device, min_steps)  # also the warm-up
    energy = EnergyMeter(device)
    telemetry.synchronize(device)
    energy.start()  # the clock and the energy counter: read at the same two synchronized points
    start = time.perf_counter()
    skipped = torch.zeros((), device=device)
    for _ in range(steps):  # no host read per step: the skip flags add up on the device
        skipped += ~torch.as_tensor(step().stepped, device=device)
    telemetry.synchronize(device)
    elapsed = time.perf_counter() - start
    joules = energy.stop()
    memory = telemetry.peak_memory(device)
    peak = telemetry.peak_tflops(telemetry.device_name(device), policy.arithmetic) if device.type == "cuda" else None
    tflops = flops * steps / elapsed / 1e12
    result = {"samples_per_s": batch * steps / elapsed, "peak_mem_mb": next(iter(memory.values())),
              "tflops": tflops, "mfu": tflops / peak if peak else None, "steps": steps, "seconds": elapsed,
              "joules_per_sample": joules / (batch * steps) if energy.available else None,
              "watts": joules / elapsed if energy.available else None, "skipped_steps": float(skipped),
              "compile_s": compile_s}
    if profile:
        result.update(profile_steps(step, profile, device))
    return result


PROFILE_COLUMNS = ["wall_ms", "gpu_busy_ms", "busy_share", "matmul_ms", "attention_ms", "element-wise/other_ms",
                   "idle_ms"]


def median_row(runs: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in runs) if isinstance(runs[0].get(k), (int, float)) else runs[0].get(k)
            for k in runs[0]}


def amp_summary(rows: list[dict]) -> list[dict]:
    """AMP vs strict fp32 per (model, batch, seq): the paper's comparison, and the targets."""
    summary = []
    for row in rows:
        if row["precision"] not in ("fp16", "bf16", "bf16-pure") or not isinstance(row["samples/s"], float):
            continue
        key = (row["model"], row["batch"], row["seq"], row["compile"])
        base = next((r for r in rows if r["precision"] == "fp32" and
                     (r["model"], r["batch"], r["seq"], r["compile"]) == key), None)
        if base is None or not isinstance(base["samples/s"], float):
            continue
        summary.append({"model": row["model"], "batch": row["batch"], "seq": row["seq"], "compile": row["compile"],
                        "amp": row["precision"],
                        "speed-up vs fp32": row["samples/s"] / base["samples/s"],
                        "memory reduction": 1 - row["peak MB"] / base["peak MB"], "MFU": row["MFU"],
                        "energy/sample vs fp32": row["J/sample"] / base["J/sample"]
                        if row["J/sample"] and base["J/sample"] else None})
    return summary


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="banglabert,xlmr,mbert")
    parser.add_argument("--precisions", default="fp32,tf32,fp16,bf16")
    parser.add_argument("--batches", default="16,32,64")
    parser.add_argument("--lengths", default="128,256")
    parser.add_argument("--seconds", type=float, default=10.0, help="timed window per cell (energy resolution)")
    parser.add_argument("--min-steps", type=int, default=20)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--compile", default="eager",
                        help="comma-separated: eager, default, reduce-overhead, max-autotune (train.compile's modes)")
    parser.add_argument("--profile", action="store_true", help="profile each cell: GPU-busy vs wall, kernel kinds")
    parser.add_argument("--profile-steps", type=int, default=10)
    parser.add_argument("--name", default="gpu", help="the benchmark's name in results/NAME-MACHINE-DATE.json")
    parser.add_argument("--quick", action="store_true", help="tiny model on this machine's device, as a smoke run")
    args = parser.parse_args()
    if args.quick:
        args.models, args.precisions, args.batches, args.lengths = "tiny", "fp32,bf16", "4", "32"
        args.seconds, args.min_steps, args.reps = 0.2, 3, 1
        args.profile_steps = 2
    return args


def main():
    args = parse_args()
    quiet()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and not args.quick:
        raise SystemExit("bench_gpu.py needs a CUDA device (--quick runs a CPU smoke version)")
    precisions = args.precisions.split(",")
    if args.quick and device.type == "cpu":
        from pipeline.runtime.precision import cpu_supports_bf16

        precisions = [p for p in precisions if not p.startswith("bf16") or cpu_supports_bf16()]  # AVX2 only: fp32
    modes = args.compile.split(",")
    rows = []
    for arch in args.models.split(","):
        for length in map(int, args.lengths.split(",")):
            for batch in map(int, args.batches.split(",")):
                contenders = [(p, m) for m in modes for p in precisions]
                runs = {c: [] for c in contenders}
                for rep in range(args.reps):  # contenders alternate, the first one rotates
                    for c in contenders[rep % len(contenders):] + contenders[:rep % len(contenders)]:
                        try:
                            runs[c].append(cell(arch, c[0], batch, length, args.seconds, args.min_steps, device,
                                                c[1], args.profile_steps if args.profile else 0))
                        except torch.OutOfMemoryError:
                            runs[c].append(None)
                for p, m in contenders:
                    done = [r for r in runs[(p, m)] if r]
                    row = {"model": NAMES[arch], "precision": p, "compile": m, "batch": batch, "seq": length}
                    if not done:
                        rows.append({**row, "samples/s": "OOM"})
                        continue
                    med = median_row(done)
                    rows.append({**row, "samples/s": med["samples_per_s"], "peak MB": med["peak_mem_mb"],
                                 "TFLOP/s": med["tflops"], "MFU": med["mfu"], "J/sample": med["joules_per_sample"],
                                 "W": med["watts"], "steps": med["steps"], "s": med["seconds"],
                                 "skipped": med["skipped_steps"], "compile s": med["compile_s"],
                                 **{k: med.get(k) for k in [*PROFILE_COLUMNS, "top_kernels_ms"] if k in med}})
                    print(rows[-1], flush=True)
    summary = amp_summary(rows)
    columns = ["model", "precision", "compile", "batch", "seq", "samples/s", "peak MB", "TFLOP/s", "MFU",
               "J/sample", "W", "steps", "s", "skipped", "compile s", *(PROFILE_COLUMNS if args.profile else [])]
    save(args.name if not args.quick else "gpu-quick", rows, columns, vars(args), {"amp_vs_fp32": summary})
    if summary:
        print(markdown_table(summary, list(summary[0])))


if __name__ == "__main__":
    main()
