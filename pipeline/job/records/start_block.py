"""The lines rank 0 prints as a job starts: one as soon as the job is settled (what it will run and
where its outputs go), and a block once it is built and its run is open (the model's size, the
examples of each split, the steps, where its run is), so a job's log says what it resolved before
its first step."""
from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline import names
from pipeline.config.secrets import redact
from pipeline.kd.student import ratios
from pipeline.runtime.precision import how_resolved

if TYPE_CHECKING:
    from pipeline.config.sections import DataConfig
    from pipeline.measure.flops import ModelSize


def precision_line(requested: str, resolved: str, device_type: str) -> str:
    """The resolved precision and why: as set, or what auto found on this device."""
    return f"{resolved} ({how_resolved(requested, resolved, device_type)})"


def settled_line(kind: str, task: str, model: str, precision: str, backend: str, world_size: int,
                 output_dir: str) -> str:
    return (f"{kind}: task {task}, model {model}, precision {precision}, {backend} backend x {world_size} "
            f"process{'es' if world_size != 1 else ''}, output_dir {output_dir}; preparing data and model")


def run_url(uri: str, experiment_id: str | None, run_id: str | None) -> str:
    """The run's page where the store is a server; else the command that opens it."""
    if not run_id:
        return "none (the journal keeps every record: pipeline sync)"
    if uri.startswith(("http://", "https://")):
        return f"{redact(uri).rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
    return f"run {run_id}: python -m pipeline ui --uri {redact(uri)}"


def model_line(spec: str, size: ModelSize, teacher: ModelSize | None = None, init: str | None = None) -> str:
    """The model, its parameters (all, outside the embeddings) and forward GFLOPs per sequence; a
    student's as % of its teacher's, and how it started."""
    flops = (f"{size.forward_flops / 1e9:.3g} GFLOPs per {size.length}-token sequence"
             if size.forward_flops is not None else "forward FLOPs not countable on the meta device")
    line = (f"{spec} ({size.params / 1e6:.1f}M parameters, {size.params_non_embedding / 1e6:.1f}M outside the "
            f"embeddings; {flops}")
    if teacher is None:
        return line + ")"
    ratio = ratios(size, teacher)  # the kd/ figures the run logs
    share = f", {100 * ratio[names.KD_FLOPS_RATIO]:.0f}% of its FLOPs" if names.KD_FLOPS_RATIO in ratio else ""
    return (line + f"; {100 * ratio[names.KD_PARAM_RATIO]:.0f}% of the teacher's parameters, "
            f"{100 * ratio[names.KD_PARAM_RATIO_NON_EMBEDDING]:.0f}% outside the embeddings{share}; init {init})")


def start_block(*, task: str, model: str, precision: str, backend: str, world_size: int,
                examples: dict[str, int], steps: int, epochs: int, output_dir: str, uri: str, run: str) -> str:
    rows = [("task", task), ("model", model), ("precision", precision),
            ("backend", f"{backend} x {world_size} process{'es' if world_size != 1 else ''}"),
            ("examples", ", ".join(f"{split} {n}" for split, n in examples.items())),
            ("steps", f"{steps} optimizer steps over {epochs} epoch{'s' if epochs != 1 else ''}"),
            ("output_dir", output_dir), ("tracking", redact(uri)), ("run", run)]
    width = max(len(k) for k, _ in rows)
    return "starting:\n" + "\n".join(f"    {k.ljust(width)}  {v}" for k, v in rows)


def evaluation_data(data: DataConfig, rows: dict[str, int]) -> tuple[dict[str, str], str]:
    """The run's tags and a line for what a job evaluates on where it is not a file of its own (a
    held-out fraction of the training file, no dev, no test); `rows`: each split's examples."""
    tags = {}
    if data.holdout() is not None:
        tags[names.TAG_DEV] = data.holdout_name()
        note = (f"dev: {rows['dev']} rows held out of the training file ({tags[names.TAG_DEV]}), "
                f"{rows['train']} trained on")
    elif not data.evaluates("dev"):
        tags[names.TAG_DEV] = data.dev
        note = "no dev evaluation (data.dev=skip): the model kept is the last one"
    else:
        note = ""
    if not data.evaluates("test"):
        tags[names.TAG_NO_TEST] = "true"
        note += ("; " if note else "") + "no test split (data.test unset): no test figures"
    if data.tests_on_train():
        tags[names.TAG_TEST_IS_TRAIN] = "true"
        note += ("; " if note else "") + (f"data.test={data.test} is the training file: the test figures are of "
                                          "rows trained on")
    return tags, note


FEW_TRAIN_ROWS = 100
"""Fewer training rows than this draw a warning as the job starts: a handful of batches, whose
figures say little about the recipe (a typo such as data.dev=holdout:0.99 leaves that few)."""


def few_rows_warning(data: DataConfig, rows: dict[str, int]) -> str | None:
    """The one-line warning of a job with fewer than FEW_TRAIN_ROWS training rows, and where the
    rest went where a held-out dev took them; `rows`: each split's examples."""
    n = rows["train"]
    if n >= FEW_TRAIN_ROWS:
        return None
    held = (f" (data.dev={data.dev} held {rows['dev']} of the training file's {n + rows['dev']} rows out)"
            if data.holdout() is not None else "")
    return f"only {n} training rows{held}: under {FEW_TRAIN_ROWS}, this job's figures say little"
