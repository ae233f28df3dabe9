"""`python -m pipeline export DIR`: a stage's best model as it is served, written whole into
DIR/export/ (atomic: a failed export or check leaves the previous export, or none):

  model.onnx          the fp32 graph (dynamic batch and sequence axes, the task's head)
  model.int8.onnx     with int8: its dynamically quantized variant
  export.json         what they came from and hold (parameters, inputs, outputs, sizes)
  tokenizer files, config.json   the tokenizer and config of best/ (labels), to serve with
  check.json          with check: each graph against the PyTorch model (dev split) and its test metrics
  mlflow_model/       with check: the served graph (int8 where written, else fp32) as an MLflow onnx model
  trimmed/            with trim_vocab: the model and tokenizer with the vocabulary cut to the training
                      data's tokens (trim_vocab.py), loadable with the Auto classes; the graphs above are
                      then of this model, trim.json what the cut kept and what the dev split proved

With check the export/* metrics and that model go onto the stage's MLflow run (logged.py);
trim_vocab implies check.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from pipeline import names
from pipeline.errors import UserError
from pipeline.fsutil import atomic_dir, write_json
from pipeline.layout import OutputDir
from pipeline.tracking import finished_stage

if TYPE_CHECKING:
    from pipeline.export.check import CheckData

log = logging.getLogger("pipeline")
EXPORT, CHECK_JSON = OutputDir.EXPORT, OutputDir.EXPORT_CHECK
"""The folder in an output_dir (or in a model directory) that holds the export; the check's record in it."""
FP32, INT8 = "model.onnx", "model.int8.onnx"
MLFLOW_MODEL = "mlflow_model"
VARIANTS = {"fp32": FP32, "int8": INT8}
TRIM, TRIMMED, TRIM_JSON = "trim", "trimmed", "trim.json"
"""The export/trim/* metrics' group, the trimmed model's folder in export/, its record."""


def export(spec: str, int8: bool = False, check: bool = False, uri: str | None = None,
           trim_vocab: bool = False) -> None:
    """Export the model of `spec` (a stage's output_dir: its best/, or a model directory) into
    SPEC/export/; `trim_vocab`: of its model with the vocabulary cut to the training data's (a
    stage's output_dir only: its data)."""
    check = check or trim_vocab
    from pipeline.export.onnx_model import EXPORT_JSON, write_onnx
    from pipeline.measure.inference import count_params
    from pipeline.models import SavedModel

    root = Path(spec).expanduser()
    if not root.is_dir():
        raise UserError(f"export: {spec}: no such directory")
    # the check needs the stage's task and data: refused before any model loads
    stage = finished_stage.read(root, f"export --{'trim-vocab' if trim_vocab else 'check'}") if check else None
    saved = SavedModel(str(root))  # best/ of an output_dir, or the model directory itself
    out = OutputDir(root)
    t0 = time.perf_counter()
    model = saved.load(torch.float32, torch.device("cpu")).eval()
    tokenizer, size_mb, trim_figures, data = saved.tokenizer, saved.size_mb, {}, None
    if trim_vocab:
        from pipeline.export.trim_vocab import tokenizer_model

        tokenizer_model(tokenizer)  # a tokenizer the cut cannot keep exact: refused before anything is written
    with atomic_dir(root / EXPORT, replace=True) as tmp:
        if trim_vocab:
            model, tokenizer, trim_figures, data = _trim(stage, model, tokenizer, saved.size_mb, tmp / TRIMMED)
            size_mb = trim_figures[names.export_metric(TRIM, "size_mb")]
        params = count_params(model)
        input_names = list(tokenizer.model_input_names)
        outputs = write_onnx(model, tmp / FP32, input_names)
        if int8:
            from pipeline.export.onnx_model import quantize_int8

            quantize_int8(tmp / FP32, tmp / INT8)
        tokenizer.save_pretrained(str(tmp))
        model.config.save_pretrained(str(tmp))
        written = {v: f for v, f in VARIANTS.items() if (tmp / f).is_file()}
        sizes = {v: (tmp / f).stat().st_size / 2**20 for v, f in written.items()}
        write_json(tmp / EXPORT_JSON, {"source": str(Path(saved.source).resolve()), "params": params[0],
                                       "params_no_embed": params[1], "vocab_size": model.config.vocab_size,
                                       "input_names": input_names, "output_names": outputs,
                                       "size_mb": sizes, "pytorch_size_mb": size_mb,
                                       **({"trimmed": TRIMMED} if trim_vocab else {})})
        log.info("export: %s written in %.1fs (%s)", ", ".join(written.values()), time.perf_counter() - t0,
                 ", ".join(f"{v} {s:.1f} MB" for v, s in sizes.items()))
        report = _check(stage, model, tmp, data, written, params, sizes, size_mb) if check else None
        if report is not None:
            report["metrics"].update(trim_figures)
    if report is not None:
        shown = "int8" if "int8" in written else "fp32"
        from pipeline.export.logged import log_to_run, model_name

        name = model_name(root / EXPORT / written[shown], shown)
        run_id = log_to_run(out, report["metrics"], root / EXPORT / MLFLOW_MODEL, name, uri)
        log.info("export: checked on the %s: %s", report["compared_on"],
                 "; ".join(_summary(v, report["variants"][v]) for v in written))
        if run_id:
            log.info("export: export/* metrics and the %s graph (MLflow model %r) logged on run %s", shown, name,
                     run_id)


def _trim(stage: finished_stage.FinishedStage, model: torch.nn.Module, tokenizer, size_mb: float,
          folder: Path) -> tuple:
    """The model and tokenizer cut to the stage's training tokens, saved in `folder` and proved on
    the dev split (trim_vocab.prove) with the tokenizer as saved; the export/trim/* figures, before
    and after; the stage's data through the saved tokenizer (check.stage_data), which the check reuses."""
    from transformers import AutoTokenizer

    from pipeline.export import check, trim_vocab
    from pipeline.measure.inference import count_params
    from pipeline.models import save_pretrained_fp32

    t0 = time.perf_counter()
    texts = check.training_texts(stage)
    trimmed = trim_vocab.trim(model, tokenizer, trim_vocab.used_ids(tokenizer, texts))
    folder.mkdir()
    save_pretrained_fp32(trimmed.model, trimmed.model.state_dict(), trimmed.tokenizer, folder)
    data = check.stage_data(stage, AutoTokenizer.from_pretrained(str(folder)))
    proof = trim_vocab.prove(model, trimmed, check.stage_data(stage, tokenizer).compared, data.compared)
    before, after = count_params(model), count_params(trimmed.model)
    on_disk = sum(f.stat().st_size for f in folder.glob("*.safetensors")) / 2**20
    figures = {"vocab_size_before": model.config.vocab_size, "vocab_size": trimmed.model.config.vocab_size,
               "params_before": before[0], "params": after[0], "params_no_embed": after[1],
               "size_mb_before": size_mb, "size_mb": on_disk, **proof}
    write_json(folder.parent / TRIM_JSON, figures)
    _trimmed_card(stage.out.best, folder, figures, data.rows)
    log.info("export: vocabulary trimmed to the training data's tokens in %.1fs: %d -> %d tokens, %.1fM -> %.1fM "
             "parameters, %.1f -> %.1f MB; on the %s: %d rows, %d without a trimmed token, all predicted alike; %d "
             "with one (%d still alike)", time.perf_counter() - t0, figures["vocab_size_before"],
             figures["vocab_size"], before[0] / 1e6, after[0] / 1e6, size_mb, figures["size_mb"], data.rows,
             proof["dev_rows"], proof["dev_rows_equal"], proof["dev_rows_with_trimmed"],
             proof["dev_rows_with_trimmed_agree"])
    return (trimmed.model, trimmed.tokenizer, {names.export_metric(TRIM, k): float(v) for k, v in figures.items()},
            data)


def _trimmed_card(best: Path, folder: Path, figures: dict, rows: str) -> None:
    """best/'s model card in the trimmed folder, with what the cut changed and what `rows` (the
    check's, CheckData.rows) proved."""
    from pipeline.tracking.model_card import CARD

    card = (best / CARD).read_text(encoding="utf-8") if (best / CARD).is_file() else ""
    f = figures
    card += (f"\n\n## Vocabulary trimmed\n\nCut to the tokens the training data uses plus every special token, "
             "single character and continuation piece, so any input is still spelled: "
             f"{f['vocab_size_before']} -> {f['vocab_size']} tokens, {f['params_before'] / 1e6:.1f}M -> "
             f"{f['params'] / 1e6:.1f}M parameters, {f['size_mb_before']:.1f} -> {f['size_mb']:.1f} MB on disk. "
             f"On the {rows}, {f['dev_rows']} rows, the predictions equal the untrimmed model's on all "
             f"{f['dev_rows_equal']} rows without a trimmed token; {f['dev_rows_with_trimmed']} rows hold one, "
             f"{f['dev_rows_with_trimmed_agree']} of them predicted alike.\n")
    (folder / CARD).write_text(card, encoding="utf-8")


def _check(stage: finished_stage.FinishedStage, model: torch.nn.Module, tmp: Path, data: CheckData | None,
           written: dict[str, str], params: tuple[int, int], sizes: dict[str, float], torch_size_mb: float) -> dict:
    """Each graph against `model`: dev agreement, test metrics; the fp32 graph's verdict; check.json,
    the MLflow model, and the metrics (in the returned report). `data`: the stage's data as the
    exported tokenizer makes it (check.stage_data), read from the saved tokenizer when None."""
    from pipeline.export import check
    from pipeline.export.logged import example_rows, save_mlflow_onnx
    from pipeline.export.onnx_model import OnnxModel

    t0 = time.perf_counter()
    from transformers import AutoTokenizer

    data = data or check.stage_data(stage, AutoTokenizer.from_pretrained(str(tmp)))
    dev, test, test_scores = data.compared, data.test, data.test_scores
    report = {"compared_on": data.rows, "pytorch": {"test": test_scores(model), "size_mb": torch_size_mb},
              "variants": {},
              "tolerance": {"fp32_agreement": check.FP32_AGREEMENT,
                            "fp32_max_abs_diff_relative": check.FP32_MAX_ABS_DIFF}}
    metrics = {}
    for variant, name in written.items():
        graph = OnnxModel(tmp / name, params)
        agreement = check.compare(model, graph, dev)
        if variant == "fp32":
            check.verdict(tmp / name, agreement, data.rows)
        scores = test_scores(graph)
        report["variants"][variant] = {"file": name, "size_mb": sizes[variant], "dev": agreement, "test": scores}
        metrics.update({names.export_metric(variant, names.EXPORT_MAX_ABS_DIFF): agreement["max_abs_diff"],
                        names.export_metric(variant, names.EXPORT_AGREEMENT): agreement["agreement"],
                        names.export_metric(variant, names.EXPORT_SIZE_MB): sizes[variant],
                        **{names.export_test_metric(variant, k): v for k, v in scores.items()}})
    served = "int8" if "int8" in written else "fp32"
    example = example_rows(test or dev, OnnxModel(tmp / written[served]).input_names)
    save_mlflow_onnx(tmp / written[served], tmp / MLFLOW_MODEL, example, served)
    report["metrics"] = metrics
    report["check_s"] = round(time.perf_counter() - t0, 1)
    write_json(tmp / CHECK_JSON, report)
    return report


def _summary(variant: str, entry: dict) -> str:
    dev, main = entry["dev"], entry["test"].get("main")
    tested = "no test split" if main is None else f"test main {main:.4f}"
    return (f"{variant}: {100 * dev['agreement']:.1f}% of predictions agree with PyTorch, largest logit difference "
            f"{dev['max_abs_diff']:.2g}, {tested}, {entry['size_mb']:.1f} MB")
