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
