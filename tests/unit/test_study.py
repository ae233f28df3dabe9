"""The study runner and the comparison report.

A small study (sentiment, FP32 vs AMP, two seeds, plus a cell that crashes and one that needs
it) runs end to end, two cells at a time (`--jobs 2`, through the MLflow server the runner starts
on the store): every run holds every figure its job wrote, its report's numbers are the runs'
own, the crash is reported as failed and the rest completes, a second invocation (one cell at a
time) skips what finished, the parent run holds the children, the cells that log their model
log it in the study's experiment, and `pipeline ui` serves the experiment, its compare view and
its Models page (to headless Chromium too). The report is also checked on hand-built runs with known
figures, and bad study files fail with one line naming file and key.
"""
import re

import pytest
import yaml

from helpers import ROOT

# ------------------------------------------------------------------ study files


def _cli(args, capsys):
    from pipeline.cli import main

    code = main([str(a) for a in args])
    return code, capsys.readouterr()


BAD = [
    ({"name": "x", "matrix": {"taskz": ["sentiment"]}}, "matrix.taskz: unknown key"),
    ({"name": "x", "matrix": {"procedures": ["nope"]}}, "matrix.procedures: 'nope': not declared"),
    ({"name": "x", "procedures": {"p": {"overrides": ["train.nope=1"]}}, "matrix": {"procedures": ["p"]}},
     "procedures.p.overrides: unknown key 'train.nope'"),
    ({"name": "x", "procedures": {"p": {"overrides": ["train.lr=-1"]}}, "matrix": {"procedures": ["p"]}},
     "procedures.p.overrides: train.lr=-1.0: must be > 0"),
    ({"name": "x", "procedures": {"kd": {"command": "distill", "overrides": ["kd.teacher=${teacher.output_dir}"]}},
      "matrix": {"procedures": ["kd"]}}, "procedures.kd.overrides: ${teacher.output_dir}: no cell of procedure"),
    ({"name": "x", "launcher": {"type": "slurm"}}, "launcher.type: 'slurm': must be one of"),
    ({"name": "x", "matrix": {"seeds": ["one"]}}, "matrix.seeds: 'one': a seed must be an integer"),
    ({"matrix": {}}, "name: required"),
    ({"name": "x", "procedures": {"p": {"export": {"int4": True}}}, "matrix": {"procedures": ["p"]}},
     "procedures.p.export.int4: unknown key (expected int8 or trim_vocab)"),
]


@pytest.mark.parametrize("spec,message", BAD, ids=[m.split(":")[0] for _, m in BAD])
def test_bad_study_file_is_one_line_naming_file_and_key(tmp_path, capsys, spec, message):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(spec))
    code, out = _cli(["study", path, "--dry-run"], capsys)
    assert code == 2
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: "), out.err
    assert message in lines[0]


def test_dry_run_orders_dependencies_and_builds_launcher_commands(tmp_path, capsys):
    ds = tmp_path / "zero2.json"
    ds.write_text("{}")
    path = tmp_path / "kd.yaml"
    path.write_text(yaml.safe_dump({
        "name": "kd", "output_root": str(tmp_path / "out"), "overrides": [f"tracking.uri=sqlite:///{tmp_path}/m.db"],
        "launcher": {"type": "deepspeed", "nproc": 4, "config": str(ds)},
        "procedures": {  # declared (and listed) before the teacher it needs: runs after it
            "kd_amp": {"command": "distill", "launcher": {"type": "torchrun", "nproc": 2},
                       "overrides": ["model=from_teacher:3", "kd.teacher=${teacher.output_dir}", "precision=auto"]},
            "teacher": {"command": "train"},
        },
        "matrix": {"tasks": ["wikiqa"], "procedures": ["kd_amp", "teacher"], "seeds": [7]},
    }))
    code, out = _cli(["study", path, "--dry-run", "train.epochs=1"], capsys)
    assert code == 0, out.err
    names = re.findall(r"^- (\S+)", out.out, re.M)
    assert names == ["wikiqa-teacher-s7", "wikiqa-kd_amp-s7"]
    teacher_cmd, kd_cmd = re.findall(r"^    (.+)$", out.out, re.M)
    assert "deepspeed --num_gpus 4 --module pipeline train" in teacher_cmd
    assert f"backend=deepspeed deepspeed={ds}" in teacher_cmd
    assert "-m torch.distributed.run --nproc_per_node 2 --standalone -m pipeline distill" in kd_cmd
    assert f"kd.teacher={tmp_path / 'out' / 'kd' / 'wikiqa-teacher-s7'}" in kd_cmd
    for tag in ("tracking.experiment=kd", "tracking.tags.study=kd", "tracking.tags.procedure=kd_amp",
                "tracking.tags.cell=wikiqa-kd_amp-s7", "tracking.run_name=wikiqa-kd_amp-s7", "seed=7",
                f"output_dir={tmp_path / 'out' / 'kd' / 'wikiqa-kd_amp-s7'}"):
        assert tag in kd_cmd
    assert kd_cmd.index("precision=auto") < kd_cmd.index("train.epochs=1")  # the command line's come last
    assert not (tmp_path / "m.db").exists()  # a dry run touches nothing


def test_a_procedure_that_exports_runs_the_export_after_its_stage(tmp_path, capsys):
    path = tmp_path / "e.yaml"
    path.write_text(yaml.safe_dump({"name": "e", "output_root": str(tmp_path / "out"),
                                    "procedures": {"s": {"export": {"int8": True}}, "t": {"export": False}},
                                    "matrix": {"procedures": ["s", "t"]}}))
    code, out = _cli(["study", path, "--dry-run"], capsys)
    assert code == 0, out.err
    assert re.findall(r"^    then .+ -m pipeline export (\S+) --check --int8$", out.out, re.M) == [
        str(tmp_path / "out" / "e" / "s")]  # one export line: t has none


def test_shipped_study_files_plan(capsys):
    sizes = {"demo.yaml": 12, "demo-gpu.yaml": 4, "wikiqa_kd.yaml": 12, "bangla_amp.yaml": 144}
    for name, n in sizes.items():
        code, out = _cli(["study", ROOT / "launch" / "studies" / name, "--dry-run"], capsys)
        assert code == 0, out.err
        assert out.out.startswith(f"study {name[:-5]}: {n} cells")


def _machine_study(tmp_path, **spec):
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({"name": "m", "output_root": str(tmp_path / "out"),
                                    "overrides": [f"tracking.uri=sqlite:///{tmp_path}/m.db", "model=preset:bangla-tiny",
                                                  "train.max_length=32", "train.batch_size=8"], **spec}))
    return path


def test_a_dry_run_names_the_data_files_and_hub_models_this_machine_lacks(tmp_path, capsys):
    """Missing files and an uncached hub model, each with the cells they stop; the built-in sample
    set and a preset need nothing."""
    data = tmp_path / "nowhere"
    path = _machine_study(tmp_path, matrix={
        "tasks": {"sentiment": [], "error_cls": [f"data.{s}={data}/{s}.csv" for s in ("train", "dev", "test")]},
        "models": ["preset:bangla-tiny", "nobody/not-cached-here"], "seeds": [1, 2]})
    code, out = _cli(["study", path, "--dry-run"], capsys)
    assert code == 0, out.err
    assert "lacks what 6 of the 8 cells ask for; 6 of them would fail:" in out.out
    assert (f"- data files not here: {data}/train.csv, {data}/dev.csv, {data}/test.csv (the 4 cells with task "
            "error_cls)\n") in out.out
    assert ("- the Hugging Face hub, for models not in its cache here: nobody/not-cached-here (the 4 cells with "
            "model nobody/not-cached-here)\n") in out.out
    assert "  Not estimated, 6 cell run(s): this machine lacks what they need (above)." in out.out
    assert not (tmp_path / "m.db").exists()


def test_a_dry_run_flags_fp16_on_a_machine_without_cuda_and_estimates_the_rest(tmp_path, capsys, monkeypatch):
    """On a CPU without fp16 kernels, the fp16 cells fail as their stage would; the fp32 cells are
    estimated: their steps counted from the plan, their time at the matmul rate timed here."""
    import torch

    from pipeline.runtime import precision
    from pipeline.study import estimate

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(precision, "cpu_supports_fp16", lambda: False)
    monkeypatch.setattr(estimate, "matmul_rate", lambda device, dtype, shape: 1e9)
    path = _machine_study(tmp_path, matrix={"tasks": ["sentiment"], "precisions": ["fp32", "fp16"],
                                            "seeds": [1, 2]}, overrides=[
        f"tracking.uri=sqlite:///{tmp_path}/m.db", "model=preset:bangla-tiny", "train.max_length=32",
        "train.batch_size=8", "train.max_steps=5"])
    code, out = _cli(["study", path, "--dry-run"], capsys)
    assert code == 0, out.err
    assert ("This machine (a CPU, no CUDA) lacks what 2 of the 4 cells ask for; 2 of them would fail:\n"
            "- a device that runs precision=fp16: this CPU has no fp16 kernels (oneDNN reports none); use bf16 or "
            "fp32 (the 2 cells with precision fp16)\n") in out.out
    found = re.search(r"^Time, an estimate \(not a measurement\): about (\d+) s for 2 cell run\(s\) one after another "
                      r"on this CPU \(10 optimizer steps, (\S+) FLOPs\)\.$", out.out, re.M)
    assert found, out.out
    assert int(found.group(1)) == round(float(found.group(2)) / 1e9)  # at the rate timed
    assert "  How: each cell's trained rows x 3 " in out.out and "at the matmul rate timed here" in out.out
    assert "  Not estimated, 2 cell run(s): this machine lacks what they need (above)." in out.out


def test_study_no_timing_reaches_the_report_here_and_on_slurm(tmp_path, capsys, monkeypatch):
    """`study --no-timing` writes the report as `report --no-timing` does, and so does the report
    job of a study on Slurm."""
    import pandas as pd

    from pipeline import report
    from pipeline.report import cells as report_cells
    from pipeline.study import runner

    class Store:  # the study's store, where no cell ran
        def __getattr__(self, name):
            return lambda *args, **kwargs: []

    monkeypatch.setattr(runner.OpenStudy, "open", classmethod(
        lambda cls, study, cells: cls(study, None, "fake://", Store(), "0", "parent", {})))
    monkeypatch.setattr(report_cells, "read_cells", lambda client, experiment: (None, pd.DataFrame(
        {"cell": [], "status": []})))
    asked = []
    monkeypatch.setattr(report, "write_report", lambda uri, experiment, out, timing=True: asked.append(timing) or out)
    path = _machine_study(tmp_path, matrix={"tasks": ["sentiment"]}, slurm={"partition": "gpu"})
    for args in ([], ["--no-timing"]):
        _cli(["study", path, "--report-only", *args], capsys)
    assert asked == [True, False]
    code, out = _cli(["study", path, "--executor", "slurm", "--dry-run", "--no-timing"], capsys)
    assert code == 0, out.err
    assert re.search(r"^    exec .+ -m pipeline study \S+ --report-only --no-timing$", out.out, re.M), out.out


def _cell_commands(out: str) -> dict[str, str]:
    """A dry run's listing: cell name -> its command line."""
    return dict(re.findall(r"^- (\S+)\n    (.+)$", out, re.M))


def test_bangla_amp_is_the_papers_experiment(capsys):
    """FP32 against the paper's fp16 AMP (and bf16 as a third arm), Table I's sentiment row as given
    (lr 5e-5, batch 16, 3 epochs), and every other setting's source named in the file."""
    path = ROOT / "launch" / "studies" / "bangla_amp.yaml"
    code, out = _cli(["study", path, "--dry-run"], capsys)
    assert code == 0, out.err
    cells = _cell_commands(out.out)
    sentiment = {name: cmd for name, cmd in cells.items() if name.startswith("sentiment-banglabert-")}
    assert {re.search(r" precision=(\S+)", cmd).group(1) for cmd in sentiment.values()} == {"fp32", "fp16", "bf16"}
    for cmd in sentiment.values():
        settings = dict(re.findall(r" (train\.(?:lr|batch_size|epochs))=(\S+)", cmd))
        assert settings == {"train.lr": "5e-5", "train.batch_size": "16", "train.epochs": "3"}, cmd
    text = path.read_text()
    assert "Table I" in text and "chosen here" in text
    for task in ("sentiment", "ner", "error_cls", "qa"):  # each task's settings say where they come from
        assert re.search(rf"^#   {task}\s+lr ", text, re.M), task


def test_one_procedures_cells_change_from_the_command_line(capsys):
    """PROCEDURE:key=value changes that procedure's cells alone: the thesis's BERT teacher without
    touching its students; a procedure the study lacks is one line, exit 2."""
    path = ROOT / "launch" / "studies" / "wikiqa_kd.yaml"
    code, out = _cli(["study", path, "--dry-run", "teacher:model=bert-base-uncased", "train.epochs=1"], capsys)
    assert code == 0, out.err
    cells = _cell_commands(out.out)
    assert len(cells) == 12
    for name, cmd in cells.items():
        assert "train.epochs=1" in cmd
        models = re.findall(r" model=(\S+)", cmd)
        if "-teacher-" in name:
            assert models[-1] == "bert-base-uncased", cmd
        else:
            assert "bert-base-uncased" not in cmd, cmd
    code, out = _cli(["study", path, "--dry-run", "teachr:model=bert-base-uncased"], capsys)
    assert code == 2
    assert out.err.strip().splitlines() == [
        f"error: {path}: command line: teachr:model=bert-base-uncased: no procedure 'teachr' in the study (declared: "
        "teacher, baseline, kd_fp32, kd_amp); PROCEDURE:key=value changes that procedure's cells"]
