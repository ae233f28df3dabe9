"""best/README.md: the model card of the best model, in the Hugging Face layout (YAML front matter,
then Markdown), so a model pushed or shared from best/ says what it is: task, base model or teacher,
data, precision, launch, seed, and its scores. Written with the model each time best/ is saved (the
dev scores so far), and again when the job finishes (the test scores and the inference figures).
What it says is the stage's as its job recorded it (finished_stage.py: job.json, written before
training starts)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from pipeline import names
from pipeline.fsutil import write_text
from pipeline.kd.student import WIDTHS, spaced_layers, student_width
from pipeline.layout import OutputDir
from pipeline.tracking import finished_stage

if TYPE_CHECKING:
    from pipeline.config.schema import SettledTrain
    from pipeline.job_record import JobRecord
    from pipeline.tasks.base import Task
    from pipeline.tracking.finished_stage import FinishedStage

CARD = "README.md"
LIBRARY = "bangla-amp-pipeline"


def write_card(target: Path, out: OutputDir, metrics: dict[str, float]) -> None:
    """The card into model directory `target` (best/, or the directory about to become it), from
    the stage in `out` (finished_stage.py: its job's record) and `metrics` (eval/, test/ and infer/
    figures, any of them)."""
    write_text(Path(target) / CARD, card_text(out, metrics))


def card_text(out: OutputDir, metrics: dict[str, float]) -> str:
    # before a job writes its record there is nothing to say but the scores
    stage = finished_stage.read(out, "model card") if out.job.is_file() else None
    task_name = stage.cfg.task if stage else ""
    task = stage.task if stage else None
    model = stage.model_spec if stage else None
    teacher = stage.cfg.kd.teacher if stage and stage.kind == "distill" else None
    student = (_student(model, teacher, stage.cfg.model_config)
               if teacher and model and model.startswith("from_teacher:") else None)
    front = {"library_name": "transformers", "tags": [LIBRARY, *([task_name] if task_name else []),
                                                       *(["knowledge-distillation"] if teacher else [])]}
    if task and task.serving_task:
        front["pipeline_tag"] = task.serving_task
    base = [m for m in (model, teacher) if m and _hub_id(m)]
    if base:
        front["base_model"] = base[0]
    data = dataclasses.asdict(stage.cfg.data) if stage else {}
    hub_data = sorted({v.removeprefix("hub:").split(":")[0] for v in data.values() if v and v.startswith("hub:")})
    if hub_data:
        front["datasets"] = hub_data
    origin = f" from {teacher}: {student}" if student else f" from {model}" if model else ""
    lines = ["---", yaml.safe_dump(front, sort_keys=False, allow_unicode=True).rstrip(), "---", "",
             f"# {Path(str(out)).name}", "",
             f"A {task_name} model {'distilled' if teacher else 'trained'} by {LIBRARY}{origin}.", ""]
    if stage:
        lines += ["## Training", "", *_table(_training(stage, task, model, teacher, student, data, metrics)), ""]
    scores = [(k, v) for k, v in metrics.items() if k.startswith((names.TEST, names.EVAL))]
    lines += ["## Scores", ""]
    lines += _table([(k, f"{v:.4f}") for k, v in scores]) if scores else ["Not evaluated yet."]
    inference = [(k.removeprefix(names.INFER), _figure(v)) for k, v in metrics.items() if k.startswith(names.INFER)]
    if inference:
        lines += ["", "## Inference (measured at the end of training, on the training device)", "",
                  *_table(inference)]
    return "\n".join(lines) + "\n"


def _training(stage: FinishedStage, task: Task, model: str, teacher: str | None, student: str | None, data: dict,
              metrics: dict[str, float]) -> list[tuple[str, str]]:
    """The Training table's rows: what the stage is and how it ran."""
    record, train = stage.record, stage.cfg.train
    rows = [("task", stage.cfg.task + (f" ({task.serving_task})" if task.serving_task else "")),
            ("student of the teacher", student) if student else ("base model", model)]
    if teacher:
        rows.append(("teacher (distilled from)", teacher))
    for split in ("train", "dev", "test"):
        rows.append((f"data: {split}", _data(split, data, record, stage.cfg.task)))
    rows.append(("precision", record.precision))
    rows.append(("launch", f"{record.backend} backend, {record.world_size} process"
                           f"{'es' if record.world_size != 1 else ''}, global batch {record.global_batch}"))
    return [*rows, ("seed", str(stage.cfg.seed)), _trained(train, metrics), ("learning rate", str(train.lr))]


def _student(model: str, teacher: str, model_config: dict) -> str:
    """`from_teacher:N` as a sentence: which of the teacher's layers (where its config.json is
    here), at which width, and how the student was initialised from them."""
    n = int(model.split(":", 1)[1])
    folder = Path(teacher).expanduser()
    best = OutputDir(folder).trained_model() if folder.is_dir() else None
    config = (best or folder) / "config.json"
    theirs = json.loads(config.read_text(encoding="utf-8")) if config.is_file() else {}
    total = theirs.get("num_hidden_layers")
    layers = f"its layers {', '.join(map(str, spaced_layers(n, total)))} of {total}" if total else f"{n} of its layers"
    width = student_width(model_config, theirs) if all(k in theirs for k in WIDTHS) else model_config
    narrowed = {k: v for k, v in width.items() if k in WIDTHS and v != theirs.get(k)}
    if not narrowed:
        return f"{model}: the teacher's embeddings, head and {layers}, copied (init teacher-layers)"
    width = ", ".join(f"{WIDTHS[k]} {v}" + (f" (the teacher's {theirs[k]})" if k in theirs else "")
                      for k, v in narrowed.items())
    return (f"{model}: the teacher's embeddings, head and {layers}, narrowed to {width}, each weight the "
            "teacher's evenly spaced slice, attention heads whole (init weight-selection)")


def _trained(train: SettledTrain, metrics: dict[str, float]) -> tuple[str, str]:
    """How long it trained: the steps and epochs done once the job finished, else the plan."""
    if names.TRAIN_STEPS not in metrics:
        return "epochs (planned)", str(train.epochs)
    steps, epochs = int(metrics[names.TRAIN_STEPS]), metrics.get(names.TRAIN_EPOCHS)
    done = f"{steps} optimizer steps" + (f" in {int(epochs)} epoch{'s' if epochs != 1 else ''}" if epochs else "")
    limit = train.max_steps
    return "trained", done + (f" (stopped by train.max_steps={limit})" if limit and limit > 0 else "")


def _hub_id(spec: str) -> bool:
    """A hub id (org/name), not a preset, a from_teacher student or a local directory."""
    return "/" in spec and ":" not in spec and not spec.startswith((".", "/", "~")) and not Path(spec).exists()


def _data(split: str, data: dict, record: JobRecord, task: str) -> str:
    value = data.get(split)
    if value is None and any(data.values()):
        return "none (unset beside a given data key: no test figures)"
    if value == "skip":
        return "none (data.dev=skip: no dev evaluation, the last model kept)"
    shown = value if value and value != "samples" else f"the built-in {task} {split} set (synthetic)"
    if shown.startswith("holdout:"):
        shown = f"{shown}: rows held out of the training file, trained on no more"
    fingerprint = (record.data.get(split) or {}).get("fingerprint")
    return f"{shown} ({fingerprint})" if fingerprint else shown


def _figure(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.4g}"


def _table(rows: list[tuple[str, str]]) -> list[str]:
    return ["| | |", "|---|---|", *(f"| {k} | {str(v).replace('|', chr(92) + '|')} |" for k, v in rows)]
