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
--profile adds, per cell, a torch.profiler trace of --profile-steps steps after the window
(benchmarks/kernel_profile.py): device kernels only, each in one class (matmul, attention, optimizer,
norm+dropout+residual, activation, casts, other), busy time as the union of kernel intervals, and
each class beside its floor (its FLOPs at the tensor cores' peak or its bytes at the memory
bandwidth): one table per cell, every kernel's ms and class in the JSON. Each cell's figures are
also written to results/NAME-MACHINE-DATE.partial.json as it ends (removed once the run completes),
so a run cut short by a time limit keeps the cells it finished.
--variants adds contenders to the first precision, each beside the default in the same run:
sdpa-cudnn, sdpa-flash, sdpa-efficient, sdpa-math (the attention kernel allowed), gemm-autotune
(inductor's GEMM templates with their epilogues fused, under the mode's CUDA graphs),
coordesc (inductor's coordinate-descent tuning of its element-wise and reduction kernels),
pure-batched (bf16-pure, its weight and gradient copies one foreach call each, not one per parameter),
attn-dropout-0 (no dropout on the attention probabilities: what it costs the attention kernels;
a change of the model, not a candidate default).
    python benchmarks/bench_gpu.py [--models banglabert,xlmr,mbert] [--reps 2] [--seconds 10]
    python benchmarks/bench_gpu.py --models banglabert --precisions fp32,bf16 --compile eager,reduce-overhead --profile
    python benchmarks/bench_gpu.py --tables results/FILE.json   # the class tables of a results file
    python benchmarks/bench_gpu.py --floors "NVIDIA H200" --models banglabert --precisions bf16 --batches 32
    python benchmarks/bench_gpu.py --quick   # a tiny CPU smoke run of the same code
"""
import argparse
import contextlib
import gc
import json
import math
import statistics
import tempfile
import time
from pathlib import Path

import torch

from common import RESULTS, markdown_table, quiet, result_path, save

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
MAX_STEPS = 100_000
INDUCTOR_VARIANTS = {  # torch._inductor.config values a contender sets
    "gemm-autotune": {"max_autotune_gemm": True, "epilogue_fusion": True},
    "coordesc": {"coordinate_descent_tuning": True},
}
MODEL_VARIANTS = {  # config values a contender changes: what a kernel class costs, not a candidate default
    "attn-dropout-0": {"attention_probs_dropout_prob": 0.0},
}
VARIANT_PRECISION = {"pure-batched": "bf16-pure"}  # a variant of one precision runs in it, not the first one
VARIANTS = ("default", "sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "sdpa-math", *INDUCTOR_VARIANTS,
            *MODEL_VARIANTS, *VARIANT_PRECISION)


def build(arch: str, device, **overrides):
    from transformers import AutoConfig, AutoModelForSequenceClassification

    model_type, sizes = ARCHS[arch]
    config = AutoConfig.for_model(model_type, num_labels=3, **sizes, **overrides)
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


def profile_steps(step, steps: int, device) -> dict:
    """Per step: host wall ms, and from torch.profiler's trace the kernel window, busy time (union of
    kernel intervals) and each kernel class's ms and launches (benchmarks/kernel_profile.py)."""
    from torch.profiler import ProfilerActivity, profile

    import kernel_profile as kernels
    from pipeline.measure import telemetry

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    telemetry.synchronize(device)
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        telemetry.synchronize(device)
        wall = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as tmp:  # the Chrome trace: each event's category names a kernel
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text()).get("traceEvents", [])
    table = kernels.profile_table(events, steps)
    if device.type == "cuda" and not table["kernels"]:
        print("the profile holds no kernel events: torch.profiler could not trace the device (CUPTI)", flush=True)
    return {"wall_ms": wall * 1000 / steps, **table}


@contextlib.contextmanager
def variant(name: str):
    """What a --variants contender changes, for one cell (model build, compile and steps)."""
    if name.startswith("sdpa-"):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                   "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[name.removeprefix("sdpa-")]
        with sdpa_kernel([backend]):  # the global flags aten reads when it picks the kernel, also at trace time
            yield
    elif name in INDUCTOR_VARIANTS:
        import torch._inductor.config as inductor_config

        with inductor_config.patch(INDUCTOR_VARIANTS[name]):
            yield
    elif name == "pure-batched":
        from master_weights_batched import batched

        with batched():
            yield
    else:
        yield


def cell(arch, precision_name, batch, length, seconds, min_steps, device, mode="eager", profile=0,
         variant_name="default") -> dict:
    with variant(variant_name):
        return run_cell(arch, precision_name, batch, length, seconds, min_steps, device, mode, profile,
                        MODEL_VARIANTS.get(variant_name, {}))


def run_cell(arch, precision_name, batch, length, seconds, min_steps, device, mode, profile, overrides) -> dict:
    import kernel_profile as kernels
    from pipeline.measure import telemetry
    from pipeline.measure.energy import EnergyMeter
    from pipeline.runtime import compiler, precision
    from pipeline.runtime.torch_backend import TorchBackend
    from pipeline.runtime.world import Runtime

    torch._dynamo.reset()  # a fresh compilation per cell: cached graphs of another cell would be reused
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    telemetry.reset_peak_memory(device)
    policy = precision.resolve(precision_name, device)
    policy.apply_matmul_mode()  # strict fp32 (TF32 off) or tf32, process-wide, as a stage applies it
    torch.manual_seed(0)
    model = build(arch, device, **overrides)
    shape = kernels.StepShape.of(model, batch, length, policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    backend = TorchBackend(Runtime("none", "single", 0, 0, 1, 1, device), policy, max_grad_norm=1.0)
    backend.prepare(model, optimizer)
    vocab = model.config.vocab_size
    # no attention mask: every row is full length, and the pipeline drops an all-ones mask too (a compiled
    # model cannot, so SDPA would get a 4-D mask and leave its flash kernel out)
    inputs = {"input_ids": torch.randint(5, vocab, (batch, length), device=device),
              "labels": torch.randint(0, 3, (batch,), device=device)}

    def step():
        if mode in ("reduce-overhead", "max-autotune"):  # both replay CUDA graphs
            torch.compiler.cudagraph_mark_step_begin()
        with policy.autocast():
            loss = model(**inputs).loss
        backend.backward(loss)
        return backend.step()

    flops_by_kind = kernels.count_flops_by_kind(step)  # forward + backward of one step, outside the window
    flops = sum(flops_by_kind.values())
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
    name = telemetry.device_name(device)
    peak = telemetry.peak_tflops(name, policy.arithmetic) if device.type == "cuda" else None
    tflops = flops * steps / elapsed / 1e12
    result = {"samples_per_s": batch * steps / elapsed, "peak_mem_mb": next(iter(memory.values())),
              "tflops": tflops, "mfu": tflops / peak if peak else None, "steps": steps, "seconds": elapsed,
              "joules_per_sample": joules / (batch * steps) if energy.available else None,
              "watts": joules / elapsed if energy.available else None, "skipped_steps": float(skipped),
              "compile_s": compile_s}
    if profile:
        table = profile_steps(step, profile, device)
        bandwidth = kernels.peak_bandwidth_tbs(name) if device.type == "cuda" else None
        table["floors_ms"] = kernels.step_floors(flops_by_kind, shape, peak, bandwidth)
        table["flops_by_kind"], table["step_bytes"] = flops_by_kind, kernels.step_bytes(shape)
        result.update(table)
    return result


PROFILE_COLUMNS = ["wall_ms", "window_ms", "busy_ms", "busy_share", "idle_ms"]
PROFILE_KEYS = ("window_ms", "busy_ms", "busy_share", "idle_ms", "classes", "kernels", "floors_ms", "flops_by_kind",
                "step_bytes")


def contender_label(row: dict) -> str:
    return " ".join(str(row[k]) for k in ("precision", "compile", "variant") if row.get(k) not in (None, "default"))


def class_tables(rows: list[dict]) -> str:
    """Markdown: per profiled row, class / ms / launches / floor ms / ratio; then per (model, batch,
    seq) the classes' ms of every contender side by side, the first one's as the baseline."""
    import kernel_profile as kernels

    profiled = [r for r in rows if isinstance(r.get("profile"), dict)]
    parts = []
    for row in profiled:
        title = f"{row['model']}, {row['batch']} x {row['seq']}, {contender_label(row)}"
        share = row["profile"]["busy_share"]
        parts.append(f"{title}: busy {row['profile']['busy_ms']:.3g} of {row['profile']['window_ms']:.3g} ms "
                     f"a step (share {share if share is None else round(share, 3)})\n"
                     + markdown_table(kernels.floor_rows(row["profile"], row["profile"]["floors_ms"]),
                                      ["class", "ms", "launches", "floor ms", "ratio"]))
    shapes = {(r["model"], r["batch"], r["seq"]) for r in profiled}
    for shape in sorted(shapes, key=str):
        group = [r for r in profiled if (r["model"], r["batch"], r["seq"]) == shape]
        if len(group) < 2:
            continue
        side = [{"class": cls, **{contender_label(r): r["profile"]["classes"][cls]["ms"] for r in group}}
                for cls in kernels.CLASSES]
        side.append({"class": "busy (union)", **{contender_label(r): r["profile"]["busy_ms"] for r in group}})
        side.append({"class": "window", **{contender_label(r): r["profile"]["window_ms"] for r in group}})
        for cls in ("casts", "optimizer"):  # what bf16 compute weights were to remove, and what they add
            side.append({"class": f"{cls} launches", **{contender_label(r): r["profile"]["classes"][cls]["launches"]
                                                        for r in group}})
        side.append({"class": "launches", **{contender_label(r): sum(c["launches"] for c in
                                                                     r["profile"]["classes"].values())
                                             for r in group}})
        parts.append(f"{shape[0]}, {shape[1]} x {shape[2]}: ms a step by class\n"
                     + markdown_table(side, ["class", *[contender_label(r) for r in group]]))
    return "\n\n".join(parts)


def tables_of(path: Path) -> str:
    """The class tables of a results file, its kernels re-classed by the current rules; a file that
    holds only its top kernels (older runs) gets those classified, marked as a part of the step."""
    import kernel_profile as kernels

    rows = json.loads(path.read_text())["rows"]
    if any(isinstance(r.get("profile"), dict) for r in rows):
        for row in (r for r in rows if isinstance(r.get("profile"), dict)):  # by the current rules
            row["profile"].update(kernels.classify(row["profile"]["kernels"]))
        return class_tables(rows)
    parts = []
    for row in (r for r in rows if isinstance(r.get("top_kernels_ms"), dict)):
        by_class = kernels.classify_totals(row["top_kernels_ms"])
        counted = sum(by_class.values())
        parts.append(f"{row['model']}, {row['batch']} x {row['seq']}, {contender_label(row)}: only the top "
                     f"kernels were kept: {counted:.3g} ms of a {row['wall_ms']:.3g} ms step classified, "
                     f"no floors, no busy union\n"
                     + markdown_table([{"class": c, "ms": ms} for c, ms in by_class.items()], ["class", "ms"]))
    return "\n\n".join(parts) or f"{path}: no profile"


def meta_flops_by_kind(model, batch: int, length: int) -> dict[str, float]:
    """FLOPs of one step as the GPU's fused attention runs it, counted without a device: the model on
    the meta device runs attention as matmuls (bmm), whose FLOPs are replaced by torch's formulas for
    the fused kernels (forward, and backward with its recomputed scores), once per layer."""
    from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

    ids = torch.randint(5, 100, (batch, length), device="meta")
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=torch.zeros(batch, dtype=torch.long, device="meta")).loss.backward()
    counts = counter.get_flop_counts()["Global"]
    bmm = sum(v for op, v in counts.items() if "bmm" in str(op))
    config = model.config
    q = (batch, config.num_attention_heads, length, config.hidden_size // config.num_attention_heads)
    attention = config.num_hidden_layers * (sdpa_flop_count(q, q, q) + sdpa_backward_flop_count(q, q, q, q))
    return {"matmul": float(counter.get_total_flops() - bmm), "attention": float(attention)}


def floors_of(args) -> str:
    """--floors DEVICE: each class's floor per (model, precision, batch, length) on the named device,
    from the data sheets' figures; no device needed (the model is built on the meta device)."""
    import kernel_profile as kernels
    from pipeline.measure import telemetry
    from pipeline.runtime.precision import PrecisionPolicy

    parts = []
    for arch in args.models.split(","):
        with torch.device("meta"):
            model = build(arch, torch.device("meta"))
        model.train()
        for p in args.precisions.split(","):
            policy = PrecisionPolicy(p, "cuda")
            peak = telemetry.peak_tflops(args.floors, policy.arithmetic)
            bandwidth = kernels.peak_bandwidth_tbs(args.floors)
            for length in map(int, args.lengths.split(",")):
                for batch in map(int, args.batches.split(",")):
                    flops = meta_flops_by_kind(model, batch, length)
                    shape = kernels.StepShape.of(model, batch, length, policy)
                    floors, nbytes = kernels.step_floors(flops, shape, peak, bandwidth), kernels.step_bytes(shape)
                    rows = [{"class": c, "floor ms": floors[c], "GFLOP": flops[c] / 1e9 if c in flops else None,
                             "GB": nbytes[c] / 1e9 if c in nbytes else None} for c in kernels.CLASSES]
                    total = sum(f for f in floors.values() if f is not None) if peak and bandwidth else None
                    mfu = sum(flops.values()) / (total / 1e3) / (peak * 1e12) if total else None
                    parts.append(f"{NAMES[arch]}, {p}, {batch} x {length} on {args.floors}: floors sum to "
                                 f"{total if total is None else f'{total:.4g}'} ms a step (MFU at the floors "
                                 f"{mfu if mfu is None else f'{mfu:.3f}'})\n"
                                 + markdown_table(rows, ["class", "floor ms", "GFLOP", "GB"]))
    return "\n\n".join(parts)


def median_row(runs: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in runs) if isinstance(runs[0].get(k), (int, float)) else runs[0].get(k)
            for k in runs[0]}


def amp_summary(rows: list[dict]) -> list[dict]:
    """AMP vs strict fp32 per (model, batch, seq): the paper's comparison, and the targets."""
    summary = []
    for row in rows:
        if (row["precision"] not in ("fp16", "bf16", "bf16-pure") or not isinstance(row["samples/s"], float)
                or row.get("variant", "default") != "default"):
            continue
        key = (row["model"], row["batch"], row["seq"], row["compile"])
        base = next((r for r in rows if r["precision"] == "fp32" and r.get("variant", "default") == "default" and
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
    parser.add_argument("--profile", action="store_true",
                        help="profile each cell: kernel classes, busy union, each class beside its floor")
    parser.add_argument("--profile-steps", type=int, default=10)
    parser.add_argument("--variants", default="",
                        help="comma-separated, each beside the default, in the first precision (pure-batched: "
                             f"bf16-pure): {', '.join(VARIANTS[1:])}")
    parser.add_argument("--tables", type=Path, metavar="RESULTS_JSON",
                        help="print the kernel class tables of a results file and exit")
    parser.add_argument("--floors", metavar="DEVICE_NAME",
                        help='print each class\'s floor on a GPU of that name ("NVIDIA H200") and exit: no GPU needed')
    parser.add_argument("--name", default="gpu", help="the benchmark's name in results/NAME-MACHINE-DATE.json")
    parser.add_argument("--out", type=Path, default=RESULTS,
                        help="the folder of its JSON (and with --profile, NAME-MACHINE-DATE-tables.md)")
    parser.add_argument("--quick", action="store_true", help="tiny model on this machine's device, as a smoke run")
    args = parser.parse_args()
    unknown = [v for v in filter(None, args.variants.split(",")) if v not in VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {', '.join(unknown)} (known: {', '.join(VARIANTS)})")
    if args.quick:
        args.models, args.precisions, args.batches, args.lengths = "tiny", "fp32,bf16", "4", "32"
        args.seconds, args.min_steps, args.reps = 0.2, 3, 1
        args.profile_steps = 2
    return args


def precision_runs_here(name: str, args, device) -> bool:
    """A smoke run on a CPU that runs no bf16 (AVX2 only, without the emulation override the test
    suite sets) leaves the bf16 modes out; everything else runs."""
    from pipeline.runtime.precision import cpu_runs_bf16

    return not (args.quick and device.type == "cpu" and name.startswith("bf16") and not cpu_runs_bf16())


def main():
    args = parse_args()
    if args.tables:
        print(tables_of(args.tables))
        return
    if args.floors:
        print(floors_of(args))
        return
    quiet()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and not args.quick:
        raise SystemExit("bench_gpu.py needs a CUDA device (--quick runs a CPU smoke version)")
    precisions = [p for p in args.precisions.split(",") if precision_runs_here(p, args, device)]
    modes = args.compile.split(",")
    variants = [v for v in args.variants.split(",")
                if v and (v not in VARIANT_PRECISION or precision_runs_here(VARIANT_PRECISION[v], args, device))]
    name = args.name if not args.quick else "gpu-quick"
    partial = result_path(name, args.out).with_suffix(".partial.json")
    partial.parent.mkdir(parents=True, exist_ok=True)
    rows, cells = [], []
    for arch in args.models.split(","):
        for length in map(int, args.lengths.split(",")):
            for batch in map(int, args.batches.split(",")):
                contenders = [(p, m, "default") for m in modes for p in precisions]
                contenders += [(VARIANT_PRECISION.get(v, precisions[0]), m, v) for m in modes for v in variants
                               if v != "default"]
                runs = {c: [] for c in contenders}
                for rep in range(args.reps):  # contenders alternate, the first one rotates
                    for c in contenders[rep % len(contenders):] + contenders[:rep % len(contenders)]:
                        try:
                            runs[c].append(cell(arch, c[0], batch, length, args.seconds, args.min_steps, device,
                                                c[1], args.profile_steps if args.profile else 0, c[2]))
                        except torch.OutOfMemoryError:
                            runs[c].append("OOM")
                        except RuntimeError as error:  # a variant this device or shape cannot run
                            print(f"{c}: {str(error).splitlines()[0][:200]}", flush=True)
                            runs[c].append(f"error: {str(error).splitlines()[0][:200]}")
                        cells.append({"model": arch, "batch": batch, "seq": length, "contender": c,
                                      "result": runs[c][-1]})
                        partial.write_text(json.dumps(cells, default=str))  # kept if the run is cut short
                for p, m, v in contenders:
                    done = [r for r in runs[(p, m, v)] if isinstance(r, dict)]
                    row = {"model": NAMES[arch], "precision": p, "compile": m, "variant": v, "batch": batch,
                           "seq": length}
                    if not done:
                        rows.append({**row, "samples/s": runs[(p, m, v)][0]})
                        continue
                    med = median_row(done)
                    rows.append({**row, "samples/s": med["samples_per_s"], "peak MB": med["peak_mem_mb"],
                                 "TFLOP/s": med["tflops"], "MFU": med["mfu"], "J/sample": med["joules_per_sample"],
                                 "W": med["watts"], "steps": med["steps"], "s": med["seconds"],
                                 "skipped": med["skipped_steps"], "compile s": med["compile_s"],
                                 **{k: med.get(k) for k in PROFILE_COLUMNS if k in med}})
                    if args.profile:  # the first repetition's trace
                        rows[-1]["profile"] = {k: done[0][k] for k in PROFILE_KEYS}
                    print({k: v for k, v in rows[-1].items() if k != "profile"}, flush=True)
    summary = amp_summary(rows)
    columns = ["model", "precision", "compile", "variant", "batch", "seq", "samples/s", "peak MB", "TFLOP/s", "MFU",
               "J/sample", "W", "steps", "s", "skipped", "compile s", *(PROFILE_COLUMNS if args.profile else [])]
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    path = save(name, rows, columns, settings, {"amp_vs_fp32": summary}, results=args.out)
    partial.unlink(missing_ok=True)
    if summary:
        print(markdown_table(summary, list(summary[0])))
    if args.profile:
        tables = class_tables(rows)
        path.with_name(path.stem + "-tables.md").write_text(tables + "\n")
        print(tables)


if __name__ == "__main__":
    main()
