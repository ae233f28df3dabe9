"""`python -m pipeline infer-bench MODEL [MODEL ...] [--json]`: what saved models cost to serve on this
machine, side by side (measure/inference.py's bench_side_by_side): one table, or JSON."""
from __future__ import annotations

import argparse

from pipeline.errors import UserError


def main(args: list[str]) -> int:
    from pipeline.config.precision_modes import DEFAULT, MODES

    served_as = dict.fromkeys(m.served_as for m in MODES.values())
    parser = argparse.ArgumentParser(prog="python -m pipeline infer-bench", description=(
        "Latency (batch 1, p50/p95), throughput (serving batch), parameters, size and peak memory of "
        "each model, on token tensors already on the device (no tokenization inside the clock, warm-up "
        "excluded). The models are loaded first, then take turns, repetition by repetition, in rotating "
        "order: each figure is the median over repetitions with its min and max; the first model is the "
        "reference of the speed-up column (per repetition, then the median)."))
    parser.add_argument("models", nargs="+", metavar="MODEL",
                        help="a model directory, a stage's output_dir (its best/), a hub id in the local cache, "
                             "or an exported graph (DIR/export/model.onnx, model.int8.onnx: timed in the fp32 "
                             "turns, on the CPU)")
    parser.add_argument("--lengths", default="64,128", help="sequence lengths in tokens, comma-separated")
    parser.add_argument("--batch-size", type=int, default=32, help="the serving batch of the throughput figure")
    parser.add_argument("--precision", help=f"comma-separated ({', '.join(served_as)}); default: every one "
                                            "the device runs inference in")
    parser.add_argument("--device", help="cpu or cuda[:N]; default: cuda if there is one")
    parser.add_argument("--budget-s", type=float, default=20.0, help="seconds of timed passes per model")
    parser.add_argument("--reps", type=int, default=20, help="repetitions: turns each model takes (each turn a few "
                        "passes, so the models alternate closely)")
    parser.add_argument("--threads", type=int, help="torch threads on a CPU (default: torch's, one per core)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    opts = parser.parse_args(args)
    import json

    import torch

    from pipeline.export.onnx_model import served_graph
    from pipeline.measure import inference
    from pipeline.models import SavedModel
    from pipeline.runtime.precision import resolve

    try:
        lengths = {str(n): n for n in (int(x) for x in opts.lengths.split(",") if x.strip())}
    except ValueError:
        raise UserError(f"infer-bench: --lengths {opts.lengths}: expected whole numbers, e.g. 64,128") from None
    if (not lengths or min(lengths.values()) < 1 or opts.batch_size < 1 or opts.budget_s <= 0 or opts.reps < 1
            or (opts.threads is not None and opts.threads < 1)):
        raise UserError("infer-bench: --lengths, --batch-size, --budget-s, --reps and --threads must be positive")
    if opts.threads:
        torch.set_num_threads(opts.threads)
    try:
        device = torch.device(opts.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError:
        raise UserError(f"infer-bench: --device {opts.device}: not a device (cpu, cuda, cuda:1)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"infer-bench: --device {opts.device}: no CUDA device here")
    precisions = (opts.precision.split(",") if opts.precision else inference.inference_precisions(DEFAULT, device))
    for p in precisions:
        if p not in MODES:
            raise UserError(f"infer-bench: --precision {p}: one of {', '.join(MODES)}")
        resolve(p, device)  # what the device cannot run is refused as a stage refuses it
    precisions = list(dict.fromkeys(MODES[p].served_as for p in precisions))  # bf16-pure is served as bf16
    # every path checked before any timing
    served = {spec: served_graph(spec) if spec.endswith(".onnx") else SavedModel(spec).served()
              for spec in opts.models}
    if device.type != "cpu" and any(spec.endswith(".onnx") for spec in served):
        raise UserError(f"infer-bench: an exported graph runs on the CPU here; --device {device} cannot time it")
    results = inference.bench_side_by_side(served, device, lengths=lengths, precisions=precisions,
                                           batch_size=opts.batch_size, budget_s=opts.budget_s,
                                           reps=opts.reps)
    if opts.json:
        print(json.dumps(inference.rows(results), indent=1))
    else:
        print(inference.table(results), end="")
    return 0
