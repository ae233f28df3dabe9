"""`python -m pipeline export DIR --int8 --check` on a trained stage: the ONNX graphs (fp32, int8) with
the tokenizer in DIR/export/, the fp32 graph scoring what the PyTorch model scored, the export/*
metrics and the served graph (an MLflow onnx model) on the stage's run, loadable through
mlflow.pyfunc; and an export whose graph disagrees with PyTorch refused in one line, the export
before it left as it was; and --trim-vocab's trimmed model (export/trimmed/)."""
import copy
import json

import mlflow
import numpy as np
import onnx  # noqa: F401 - the [export] extra, which make install installs: missing, this file fails loudly
import pytest
import torch

from helpers import FAST, mlflow_runs, tracking_db
from pipeline import names
from pipeline.cli import main
from pipeline.config import load_config
from pipeline.job.run import run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    out, db = tmp / "out", tracking_db(tmp, "mlflow.db")
    figures = run(load_config(None, [*FAST, "train.epochs=1", f"output_dir={out}", f"tracking.uri=sqlite:///{db}",
                                     "tracking.experiment=e", "seed=3"]))
    assert main(["export", str(out), "--int8", "--check"]) == 0
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    yield {"out": out, "db": db, "figures": figures}
    mlflow.set_tracking_uri(previous)


def test_the_graphs_score_as_the_pytorch_model_did_and_land_on_its_run(exported):
    folder = exported["out"] / "export"
    assert {"model.onnx", "model.int8.onnx", "tokenizer.json", "config.json", "check.json"} <= {
        p.name for p in folder.iterdir()}
    check = json.loads((folder / "check.json").read_text())
    fp32, int8 = check["variants"]["fp32"], check["variants"]["int8"]
    assert fp32["dev"]["agreement"] == 1.0 and fp32["dev"]["max_abs_diff"] < 1e-3
    assert fp32["test"]["main"] == pytest.approx(exported["figures"][names.TEST_MAIN], abs=1e-6)
    assert int8["size_mb"] < fp32["size_mb"] / 2 and 0 < int8["dev"]["agreement"] <= 1
    (stage_run,) = mlflow_runs(exported["db"], "e")
    logged = stage_run.data.metrics
    assert logged[names.export_test_metric("int8", "main")] == pytest.approx(int8["test"]["main"])
    assert logged[names.export_metric("fp32", names.EXPORT_AGREEMENT)] == 1.0


def test_the_logged_onnx_model_loads_and_predicts_through_pyfunc(exported):
    (stage_run,) = mlflow_runs(exported["db"], "e")
    client = mlflow.MlflowClient()
    models = {client.get_logged_model(o.model_id).name: o.model_id for o in stage_run.outputs.model_outputs}
    (name,) = [n for n in models if n.startswith("onnx-int8-")]
    served = mlflow.pyfunc.load_model(f"models:/{models[name]}")
    from transformers import AutoTokenizer

    from pipeline.export.onnx_model import OnnxModel

    tokenizer = AutoTokenizer.from_pretrained(str(exported["out"] / "export"))
    rows = tokenizer(["ভালো লাগলো", "খুব খারাপ সেবা, আর কখনো না"], padding=True, return_tensors="np")
    feed = {k: rows[k].astype(np.int64) for k in served.metadata.get_input_schema().input_names()}
    logits = served.predict(feed)["logits"]
    import torch

    direct = OnnxModel(exported["out"] / "export" / "model.int8.onnx")(**{k: torch.from_numpy(v)
                                                                          for k, v in feed.items()})
    assert logits.shape == (2, 3) and np.allclose(logits, direct.logits.numpy(), atol=1e-5)


def test_an_export_that_disagrees_is_refused_in_one_line(exported, monkeypatch, capsys):
    from pipeline.export import onnx_model

    written = onnx_model.write_onnx
    before = (exported["out"] / "export" / "check.json").read_bytes()

    def corrupted(model, path, input_names):  # the graph written from a copy whose classifier is negated
        wrong = copy.deepcopy(model)
        with torch.no_grad():
            wrong.classifier.weight.neg_()
        return written(wrong, path, input_names)

    monkeypatch.setattr(onnx_model, "write_onnx", corrupted)
    capsys.readouterr()
    assert main(["export", str(exported["out"]), "--check"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.onnx disagrees with the PyTorch model on the dev split" in err[0], err
    assert (exported["out"] / "export" / "check.json").read_bytes() == before  # the checked export stays
    assert not list(exported["out"].glob(".export.tmp-*"))


def test_a_trimmed_vocabulary_is_proven_on_dev_loads_serves_and_lands_on_the_run(exported, tmp_path):
    """--trim-vocab on a preset student's own WordPiece (trained on these training texts, so it cuts
    little): every dev row without a cut token proven alike; export/trimmed/ loads with the Auto
    classes, predicts as best/ does, carries its card and serves as an MLflow transformers model.
    Last in this file: it rewrites export/."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from pipeline.tasks import get_task
    from pipeline.tracking.served_model import save_served_model

    out = exported["out"]
    assert main(["export", str(out), "--trim-vocab"]) == 0
    folder = out / "export" / "trimmed"
    trim = json.loads((out / "export" / "trim.json").read_text())
    assert trim["vocab_size"] <= trim["vocab_size_before"] and trim["params"] <= trim["params_before"]
    assert trim["dev_rows"] == trim["dev_rows_equal"] + trim["dev_rows_with_trimmed"] > 0
    assert "## Vocabulary trimmed" in (folder / "README.md").read_text()
    texts = ["ভালো লাগলো", "খুব খারাপ সেবা, আর কখনো না"]
    predicted = []
    for path in (out / "best", folder):
        tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForSequenceClassification.from_pretrained(path)
        with torch.no_grad():
            predicted.append(model(**tokenizer(texts, padding=True, return_tensors="pt")).logits.argmax(-1))
    assert torch.equal(*predicted)
    task = get_task("sentiment")
    save_served_model(folder, task, task.load(None, "test"), tmp_path / "served")
    served = mlflow.pyfunc.load_model(str(tmp_path / "served")).predict(texts)
    assert len(served) == 2
    (stage_run,) = mlflow_runs(exported["db"], "e")
    assert stage_run.data.metrics[names.export_metric("trim", "vocab_size")] == trim["vocab_size"]


def test_an_export_of_a_copied_output_dir_goes_onto_a_run_of_its_own(tmp_path, caplog):
    """A copy of an output_dir holds the original's journal, which names the original's run: the
    copy's export opens a new run (the copied journal replayed into it, its output_dir tag the
    copy's) and says so in one line; the original's run gets nothing. The copy's next export
    finds its own run."""
    import logging
    import shutil

    from pipeline.export.logged import log_to_run
    from pipeline.layout import OutputDir
    from pipeline.tracking import catch_up, journal
    from pipeline.tracking.journal import append

    db, original, copy = tracking_db(tmp_path), tmp_path / "original", tmp_path / "copy"
    uri = f"sqlite:///{db}"
    original.mkdir()
    start = journal.start(uri, "copied", "job", {names.TAG_OUTPUT_DIR: str(original.resolve())}, {"seed": "7"})
    append(original / "journal.jsonl", start, journal.run(None), journal.metric("train/loss", 0.5, 10, 1700000000000),
           journal.end("FINISHED"))
    first = catch_up(original, uri)
    shutil.copytree(original, copy)
    agreement = names.export_metric("fp32", names.EXPORT_AGREEMENT)
    with caplog.at_level(logging.INFO, logger="pipeline"):
        own = log_to_run(OutputDir(copy), {agreement: 1.0}, None, "graph", uri)
    assert own and own != first
    (said,) = [r.getMessage() for r in caplog.records if "is a copy of" in r.getMessage()]
    assert said == f"export: {copy} is a copy of {original.resolve()}: its records and the export go onto a new run " \
                   f"{own}, not that one's"
    runs = {r.info.run_id: r for r in mlflow_runs(db, "copied")}
    assert set(runs) == {first, own}
    assert runs[own].data.tags[names.TAG_OUTPUT_DIR] == str(copy.resolve())
    assert runs[own].data.metrics == {"train/loss": 0.5, agreement: 1.0} and runs[own].data.params == {"seed": "7"}
    assert agreement not in runs[first].data.metrics
    assert log_to_run(OutputDir(copy), {agreement: 0.5}, None, "graph", uri) == own  # its own run from now on
    assert len(mlflow_runs(db, "copied")) == 2
