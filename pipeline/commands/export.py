"""`python -m pipeline export DIR [--format onnx] [--int8] [--check] [--trim-vocab] [--uri URI]`: a stage's best model
exported for serving into DIR/export/ (pipeline/export/stage_export.py)."""
from __future__ import annotations

import argparse


def main(args: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline export", description=(
        "Export a stage's best model (DIR/best/, or a model directory) to ONNX with dynamic batch and sequence "
        "axes and the task's head, the tokenizer beside it, into DIR/export/ (written whole or not at all). "
        "--int8 adds its dynamically quantized variant (ONNX Runtime: weights int8, activations at run time). "
        "--check compares each graph with the PyTorch model on the dev split and scores it on the test split with "
        "the task's metrics (export/check.json), fails if the fp32 graph disagrees, and logs the export/* metrics "
        "and the served graph (an MLflow onnx model) on the stage's run."))
    parser.add_argument("dir", metavar="DIR", help="a stage's output_dir (its best/) or a model directory")
    parser.add_argument("--format", default="onnx", choices=["onnx"], help="the export format (onnx)")
    parser.add_argument("--int8", action="store_true", help="also the dynamically quantized int8 graph")
    parser.add_argument("--check", action="store_true", help="check against PyTorch, score on test, log on the run")
    parser.add_argument("--trim-vocab", action="store_true",
                        help="cut the vocabulary to the training data's tokens (plus what spells any input), export "
                             "that model (DIR/export/trimmed/), prove it on the dev split; implies --check")
    parser.add_argument("--uri", help="the MLflow store of the stage's run (default: $MLFLOW_TRACKING_URI, else "
                                      "the one its journal names)")
    opts = parser.parse_args(args)
    from pipeline.export.stage_export import export

    export(opts.dir, int8=opts.int8, check=opts.check, uri=opts.uri, trim_vocab=opts.trim_vocab)
    return 0
