"""A trained model as an ONNX graph, and that graph served by ONNX Runtime.

write_onnx: torch.onnx.export (the dynamo exporter, torch's default) of the model with the task's
head, every input's batch and sequence axes dynamic, the outputs named as the model names them
(logits; start_logits and end_logits for extractive QA). quantize_int8: ONNX Runtime's dynamic
quantization of that graph (weights int8 per channel, activations quantized at run time), the
fastest of the candidates measured on a CPU (docs/outputs.md, benchmarks/bench_int8.py).

OnnxModel runs a graph with ONNX Runtime's CPU provider behind the call a transformers model
answers (`model(**inputs)` -> outputs with .logits), on torch tensors, so the task's scorer
(evaluation.evaluate) and the inference benchmark (measure/inference.py) take it as they take the
PyTorch model. served_graph: an export on disk as infer-bench and the report time it.
"""
from __future__ import annotations

import contextlib
import json
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

from pipeline.errors import UserError
from pipeline.measure.inference import Served

EXPORT_JSON = "export.json"
"""Beside the graphs: what they were exported from and what they hold (parameters, outputs, inputs)."""
EXAMPLE_SHAPE = (2, 16)
"""The example the exporter traces: batch and length above 1, so neither axis is specialized."""


def write_onnx(model: torch.nn.Module, path: Path, input_names: list[str]) -> list[str]:
    """Export `model` (eval mode, fp32, on the CPU) to `path`; returns its output names."""
    model = model.float().cpu().eval()
    length = min(EXAMPLE_SHAPE[1], model.config.max_position_embeddings)
    ids = torch.randint(5, model.config.vocab_size, (EXAMPLE_SHAPE[0], length),
                        generator=torch.Generator().manual_seed(0))
    every = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
    example = {k: every[k] for k in input_names}
    with torch.no_grad():
        outputs = [k for k, v in model(**example).items() if isinstance(v, torch.Tensor)]
    batch = torch.export.Dim("batch")
    sequence = torch.export.Dim("sequence", max=model.config.max_position_embeddings)
    with _quiet(""), _quiet("torch.onnx"), warnings.catch_warnings():  # its graph optimizer logs at INFO
        warnings.simplefilter("ignore")  # the exporter's notes on transformers' code, not on the export
        program = torch.onnx.export(model, (), kwargs=example, dynamo=True, verbose=False,
                                    dynamic_shapes={k: {0: batch, 1: sequence} for k in example},
                                    input_names=list(example), output_names=outputs)
    program.save(str(path))
    return outputs


def quantize_int8(source: Path, target: Path) -> None:
    """`source`'s dynamically quantized variant: weights int8 (per channel), activations at run time."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with _quiet(""):  # it logs every tensor it leaves alone, at INFO, on the root logger
        quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8, per_channel=True)


@contextlib.contextmanager
def _quiet(name: str) -> Iterator[None]:
    """Logger `name` (the root logger for "") at ERROR for the block."""
    logger = logging.getLogger(name or None)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


class OnnxModel:
    """An ONNX graph in an ONNX Runtime session (CPU), called as a transformers model is."""

    def __init__(self, path: Path, params: tuple[int, int] = (0, 0), threads: int | None = None):
        import onnxruntime

        options = onnxruntime.SessionOptions()
        # the threads torch serves with (measure.inference.serving_threads), so both run alike
        options.intra_op_num_threads = threads or torch.get_num_threads()
        # no busy-waiting between runs: its spinning threads would take the cores from the torch
        # models timed in the next turns (and from a server's other work)
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            self.session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001 - onnxruntime raises its own types for a bad graph
            raise UserError(f"{path}: not a graph ONNX Runtime can load: {str(e).strip().splitlines()[0]}") from None
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.params = params

    def __call__(self, **inputs: torch.Tensor):
        from transformers.utils import ModelOutput

        feed = {k: inputs[k].detach().cpu().numpy() for k in self.input_names}
        outputs = self.session.run(self.output_names, feed)
        return ModelOutput(**{k: torch.from_numpy(v) for k, v in zip(self.output_names, outputs)})

    def eval(self) -> OnnxModel:
        return self

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """The PyTorch model's (export.json): a quantized weight is still one parameter."""
        return self.params[1] if exclude_embeddings else self.params[0]


def served_graph(spec: str) -> Served:
    """An exported graph on disk (DIR/export/model.onnx or model.int8.onnx, export.json beside it),
    as infer-bench and the report's side-by-side time it: on the CPU, in the precision it holds."""
    path = Path(spec).expanduser()
    if not path.is_file():
        raise UserError(f"{spec}: no such file")
    meta_path = path.parent / EXPORT_JSON
    if not meta_path.is_file():
        raise UserError(f"{spec}: no {EXPORT_JSON} beside it: not written by `python -m pipeline export`")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))

    def load(dtype: torch.dtype, device: torch.device) -> OnnxModel:
        if device.type != "cpu":
            raise UserError(f"{path}: an exported graph runs on the CPU here (ONNX Runtime's CPU provider), "
                            f"not on {device}")
        return OnnxModel(path, (meta["params"], meta["params_no_embed"]))

    return Served(load, meta["vocab_size"], meta["input_names"], path.stat().st_size / 2**20, ("fp32",))
