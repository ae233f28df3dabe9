"""Which dynamic int8 quantization serves an encoder fastest on this CPU: the candidates the ecosystem
uses, on one model, timed in turns (alternating repetitions, rotating order), at batch 32 (the
serving batch of infer-bench and the report) and batch 1:

  torch fp32         the PyTorch model as the pipeline serves it (reference of the speed-ups)
  torch int8         torch.ao.quantization.quantize_dynamic (nn.Linear -> dynamic int8, fbgemm/onednn)
  torchao int8       torchao's Int8DynamicActivationInt8WeightConfig (if torchao is installed)
  onnx fp32          torch.onnx.export (dynamo) run by ONNX Runtime's CPU provider
  onnx int8          onnxruntime.quantization.quantize_dynamic on that graph (QInt8 weights, per channel)

Each int8 candidate's largest logit difference from the fp32 model on the same inputs is reported
beside its speed; size is the serialized model's bytes. The model: a stage's best/ (--model), else
the demo's WikiQA student architecture (all-MiniLM-L6-v2 cut to its first 2 layers, untrained
head: speed depends only on shapes).
    python benchmarks/bench_int8.py [--model DIR] [--reps 5] [--lengths 22,64] [--threads 2]
"""
import io
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from common import alternate, parser, quiet, save


def student(model: str | None):
    import transformers

    from pipeline.models import SavedModel, offline_copy

    if model:
        saved = SavedModel(model)
        return saved.load(torch.float32, torch.device("cpu")).eval(), saved.tokenizer.model_input_names
    source = str(offline_copy("sentence-transformers/all-MiniLM-L6-v2"))
    config = transformers.AutoConfig.from_pretrained(source, num_hidden_layers=2, num_labels=2)
    return (transformers.AutoModelForSequenceClassification.from_pretrained(source, config=config).eval(),
            ["input_ids", "token_type_ids", "attention_mask"])


def inputs(names: list[str], batch: int, length: int, vocab: int) -> dict:
    ids = torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(0))
    every = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
    return {k: v for k, v in every.items() if k in names}


def torch_size(module: torch.nn.Module) -> float:
    buffer = io.BytesIO()
    torch.save(module.state_dict(), buffer)
    return buffer.tell() / 2**20


def main() -> None:
    p = parser(__doc__, reps=5, batch_size=32)
    p.add_argument("--model", help="a stage's output_dir or a model directory (default: the demo's student shape)")
    p.add_argument("--lengths", default="22,64")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--budget-s", type=float, default=1.5, help="timed seconds per contender, length and repetition")
    args = p.parse_args()
    quiet()
    import onnxruntime
    from onnxruntime.quantization import QuantType, quantize_dynamic

    torch.set_num_threads(args.threads)
    model, names = student(args.model)
    vocab = model.config.vocab_size
    work = Path(tempfile.mkdtemp(prefix="int8-"))
    example = inputs(names, 2, 16, vocab)
    dims = {k: {0: torch.export.Dim("batch"), 1: torch.export.Dim("sequence")} for k in example}
    torch.onnx.export(model, (), kwargs=example, dynamic_shapes=dims, dynamo=True, input_names=list(example),
                      output_names=["logits"]).save(str(work / "fp32.onnx"))
    quantize_dynamic(str(work / "fp32.onnx"), str(work / "int8.onnx"), weight_type=QuantType.QInt8,
                     per_channel=True)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = args.threads

    def session(path: Path):
        s = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        return lambda x: torch.from_numpy(s.run(["logits"], {k: v.numpy() for k, v in x.items()})[0])

    def torch_call(m):
        return lambda x: m(**x).logits

    contenders = {"torch fp32": (torch_call(model), torch_size(model))}
    dynamic = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    contenders["torch int8"] = (torch_call(dynamic), torch_size(dynamic))
    try:
        import copy

        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

        ao = copy.deepcopy(model)
        quantize_(ao, Int8DynamicActivationInt8WeightConfig())
        contenders["torchao int8"] = (torch_call(ao), torch_size(ao))
    except ImportError:
        pass
    contenders["onnx fp32"] = (session(work / "fp32.onnx"), (work / "fp32.onnx").stat().st_size / 2**20)
    contenders["onnx int8"] = (session(work / "int8.onnx"), (work / "int8.onnx").stat().st_size / 2**20)
    lengths = [int(x) for x in args.lengths.split(",")]
    batches = {n: (inputs(names, 1, n, vocab), inputs(names, args.batch_size, n, vocab)) for n in lengths}
    with torch.inference_mode():
        reference = {n: model(**batches[n][1]).logits for n in lengths}
        diffs = {name: max(float((call(batches[n][1]) - reference[n]).abs().max()) for n in lengths)
                 for name, (call, _) in contenders.items()}
        agree = {name: min(float((call(batches[n][1]).argmax(-1) == reference[n].argmax(-1)).float().mean())
                           for n in lengths) for name, (call, _) in contenders.items()}
        for call, _ in contenders.values():  # warm-up
            for n in lengths:
                call(batches[n][0]), call(batches[n][1])

    def timed(call):
        def run() -> dict:
            out = {}
            with torch.inference_mode():
                for n in lengths:
                    for label, x in (("b1", batches[n][0]), ("b32", batches[n][1])):
                        passes, t0 = 0, time.perf_counter()
                        while passes < 3 or time.perf_counter() - t0 < args.budget_s / 2:
                            call(x)
                            passes += 1
                        rows = len(next(iter(x.values())))
                        out[f"{label}_{n}"] = passes * rows / (time.perf_counter() - t0)
            return out
        return run

    runs = alternate({name: timed(call) for name, (call, _) in contenders.items()}, args.reps)
    ref = runs["torch fp32"]
    rows = []
    for name, (_, size) in contenders.items():
        row = {"contender": name, "size_mb": round(size, 1), "max_abs_diff": f"{diffs[name]:.2g}",
               "agreement": round(agree[name], 3)}
        for n in lengths:
            for label in ("b1", "b32"):
                key = f"{label}_{n}"
                row[f"{key} samples/s"] = round(statistics.median(r[key] for r in runs[name]), 1)
                row[f"{key} x"] = round(statistics.median(a[key] / b[key] for a, b in zip(runs[name], ref)), 2)
        rows.append(row)
    columns = list(rows[0])
    save(f"int8-threads{args.threads}", rows, columns,
         {"model": args.model or "all-MiniLM-L6-v2 first 2 layers", "reps": args.reps, "lengths": lengths,
          "batch_size": args.batch_size, "threads": args.threads, "onnxruntime": onnxruntime.__version__,
          "budget_s": args.budget_s}, runs)


if __name__ == "__main__":
    main()
