"""The sentiment job end to end in one process: the tests that train a model or start a process (the
others are in tests/unit/test_train.py)."""
import json
import math

import pytest
import torch
from safetensors import safe_open

from helpers import FAST, error_lines, mlflow_runs, run_cli, tracking_db
from pipeline import names, predictions
from pipeline.config import load_config
from pipeline.config.precision_modes import MODES
from pipeline.job.run import run
from pipeline.runtime import precision
from pipeline.runtime import torch_backend as backend_mod

EXPECTED_METRICS = {names.TRAIN_LOSS, names.TRAIN_LR, names.TRAIN_GRAD_NORM, names.EVAL_MAIN,
                    names.eval_metric("macro_f1"), names.eval_metric("accuracy"), names.eval_metric("micro_f1"),
                    names.EPOCH_TIME, names.SAMPLES_PER_S, names.TOKENS_PER_S, names.PADDED_TOKENS_PER_S,
                    names.PEAK_RSS, names.SKIPPED_STEPS, names.NONFINITE_LOSSES, names.TEST_MAIN}


@pytest.mark.slow
@pytest.mark.parametrize("prec", ["fp32", "bf16", "bf16-pure"])
def test_sentiment_learns_and_lands_in_mlflow(tmp_path, prec):
    out, db = tmp_path / "out", tracking_db(tmp_path, "mlflow.db")
    cfg = load_config(None, [*FAST, "train.epochs=3", f"precision={prec}", f"output_dir={out}",
                             f"tracking.uri=sqlite:///{db}", "tracking.experiment=t", "infer.bench=true",
                             "infer.budget_s=0.2"])
    figures = run(cfg)

    assert figures[names.EVAL_MAIN] > 0.6  # chance is ~0.33 macro-F1 on three balanced classes
    assert figures[names.TEST_MAIN] > 0.6
    assert json.loads((out / "metrics.json").read_text()) == pytest.approx(figures)
    assert {"config.yaml", "metrics.json", "journal.jsonl", "report.txt", "best"} <= {p.name for p in out.iterdir()}
    assert (out / "best" / "model.safetensors").is_file() and (out / "best" / "tokenizer.json").is_file()
    with safe_open(out / "best" / "model.safetensors", "pt") as f:  # master weights saved in fp32
        assert all(f.get_tensor(k).dtype.is_floating_point and f.get_tensor(k).dtype.itemsize == 4
                   for k in f.keys() if f.get_tensor(k).dtype.is_floating_point)

    (mlrun,) = mlflow_runs(db, "t")
    assert mlrun.info.status == "FINISHED"
    assert EXPECTED_METRICS <= set(mlrun.data.metrics)
    assert mlrun.data.tags["precision"] == prec and mlrun.data.tags["world_size"] == "1"
    assert mlrun.data.tags["energy_available"] == "false"
    assert mlrun.data.tags[names.TAG_DATA_CACHE] in ("hit", "miss", "partial")  # the prepared-data cache
    assert mlrun.data.params["train.lr"] == "0.001"
    assert mlrun.data.metrics[names.TEST_MAIN] == pytest.approx(figures[names.TEST_MAIN])
    # the best model's inference figures, at the test split's median and longest lengths, in the
    # precision it is served in (bf16-pure's: bf16)
    served = {names.INFER_PARAMS, names.INFER_PARAMS_NO_EMBED, names.INFER_SIZE_MB,
              *(names.infer_metric(q, MODES[prec].served_as, length) for length in names.INFER_LENGTHS
                for q in (names.INFER_LATENCY_P50, names.INFER_LATENCY_P95, names.INFER_SAMPLES_PER_S,
                          names.INFER_PEAK_RSS))}
    assert served <= set(figures) and served <= set(mlrun.data.metrics)
    assert 0 < figures[names.INFER_PARAMS_NO_EMBED] < figures[names.INFER_PARAMS]
    assert figures[names.INFER_SIZE_MB] * 2**20 == (out / "best" / "model.safetensors").stat().st_size
    assert figures[names.infer_length("median")] <= figures[names.infer_length("longest")] <= 48

    # every dev and test row's prediction by the best model, keyed by the row's id, in a small file
    # that is also an artifact of the run; its header names the data as the run's dataset inputs do
    from mlflow.tracking import MlflowClient

    logged = {i.tags[0].value: i.dataset for i in mlrun.inputs.dataset_inputs}  # context tag: the split
    for split, scores in (("dev", names.eval_metric), ("test", names.test_metric)):
        path = out / "predictions" / f"{split}.jsonl"
        kept = predictions.read(path)
        assert kept.header == {"format": predictions.FORMAT, "task": "sentiment", "split": split, "rows": 400,
                               "labels": ["Positive", "Negative", "Neutral"], "data": logged[split].digest,
                               "model": "preset:bangla-tiny", "precision": prec, "seed": cfg.seed}
        assert len({row["id"] for row in kept.rows}) == 400 and path.stat().st_size < 100 * 400  # ~86 bytes a row
        hits = [row["pred"] == row["gold"] for row in kept.rows]
        assert sum(hits) / len(hits) == pytest.approx(figures[scores("accuracy")])  # the scored model's
        assert all(sum(row["probs"]) == pytest.approx(1, abs=2e-4) for row in kept.rows)
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    assert [a.path for a in client.list_artifacts(mlrun.info.run_id, "predictions")] == [
        "predictions/dev.jsonl", "predictions/test.jsonl"]


@pytest.mark.slow
def test_fp16_overflow_in_the_loop_skips_one_step_and_keeps_the_schedule(tmp_path, monkeypatch):
    """Force an inf loss at optimizer step 3: the step is skipped, the scale halves, the LR holds."""
    monkeypatch.setattr(precision, "cpu_supports_fp16", lambda: True)  # CPU autocast fp16 runs, if slowly
    calls = {"n": 0}
    original = backend_mod.TorchBackend.backward

    def backward_with_overflow(self, loss):
        calls["n"] += 1
        original(self, loss * math.inf if calls["n"] == 3 else loss)

    monkeypatch.setattr(backend_mod.TorchBackend, "backward", backward_with_overflow)
    out = tmp_path / "out"
    cfg = load_config(None, [*FAST, "precision=fp16", "train.max_steps=6", "train.log_every=1",
                             "train.warmup_ratio=0", f"output_dir={out}", f"tracking.uri=sqlite:///{tracking_db(tmp_path)}"])
    figures = run(cfg)

    assert figures[names.SKIPPED_STEPS] == 1 and figures[names.TRAIN_STEPS] == 6
    records = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]

    def series(key):
        return {r["step"]: r["value"] for r in records if r.get("key") == key}

    scale, lr = series(names.LOSS_SCALE), series(names.TRAIN_LR)
    assert scale[3] == scale[2] / 2 and scale[4] == scale[3]
    assert lr[3] == lr[2]  # the skipped step did not advance the schedule
    assert lr[2] > lr[4] > lr[5]  # every real step did (linear decay)
    assert figures[names.LOSS_SCALE] == scale[6]


@pytest.mark.slow
def test_bad_data_fails_before_any_run(tmp_path):
    bad = tmp_path / "train.tsv"
    bad.write_text("id\ttext\tlabel\n1\tভালো\tPositive\n2\tখারাপ\tVeryBad\n", encoding="utf-8")
    db = tmp_path / "m.db"
    result = run_cli("train", f"data.train={bad}", "data.dev=samples", "data.test=samples",
                     f"output_dir={tmp_path / 'out'}", f"tracking.uri=sqlite:///{db}")
    assert result.returncode == 2
    assert error_lines(result) == [f"error: {bad}: line 3: unknown label 'VeryBad' (expected Positive, Negative, "
                                   "Neutral)"]
    assert not (tmp_path / "out").exists() and not db.exists()


@pytest.mark.slow
def test_uncached_hub_model_offline_is_one_line(tmp_path):
    # a fresh process: huggingface_hub reads HF_HUB_OFFLINE when it is imported
    result = run_cli("train", "model=csebuetnlp/banglabert", f"output_dir={tmp_path / 'out'}",
                     env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    assert result.returncode == 2
    (line,) = error_lines(result)
    assert line.startswith("error: config: model=csebuetnlp/banglabert: cannot load (offline and not in the")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_step_losses_are_read_and_reduced_only_at_log_boundaries(tmp_path, monkeypatch):
    """The loop reduces over ranks once per train.log_every steps, not once per step (each reduction
    is a device sync on a GPU), and the logged train/loss is still the mean of the steps' losses."""
    from pipeline.job import loop as job_loop
    from pipeline.runtime import collectives

    losses, in_epoch, reductions = [], [False], []
    real = {"reduce": collectives.reduce_local, "forward_backward": job_loop.forward_backward,
            "epoch": job_loop.train_epoch}

    def counted_reduce(local):
        if in_epoch[0]:
            reductions.append(local)
        return real["reduce"](local)

    def recorded_forward_backward(*args):
        loss = real["forward_backward"](*args)
        losses.append(float(loss.total))  # a StepLoss: the total and its named terms
        return loss

    def epoch(*args):
        in_epoch[0] = True
        try:
            return real["epoch"](*args)
        finally:
            in_epoch[0] = False

    monkeypatch.setattr(collectives, "reduce_local", counted_reduce)
    monkeypatch.setattr(job_loop, "forward_backward", recorded_forward_backward)
    monkeypatch.setattr(job_loop, "train_epoch", epoch)
    out = tmp_path / "out"
    run(load_config(None, [*FAST, "train.max_steps=20", "train.log_every=5", f"output_dir={out}",
                           f"tracking.uri=sqlite:///{tracking_db(tmp_path)}"]))

    assert len(losses) == 20 and len(reductions) == 20 // 5  # one reduction per log boundary, none per step
    records = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]
    logged = {r["step"]: r["value"] for r in records if r.get("key") == names.TRAIN_LOSS and r["step"] % 5 == 0}
    assert logged == pytest.approx({step: sum(losses[step - 5:step]) / 5 for step in (5, 10, 15, 20)}, rel=1e-6)


def own_sentiment_file(tmp_path, rows=300):
    """The first `rows` rows of the built-in sentiment training set, as a user's file."""
    from pipeline.tasks import get_task

    (tmp_path / "samples").mkdir()
    lines = get_task("sentiment", {}).write_samples(tmp_path / "samples")["train"].read_text().splitlines(True)
    (tmp_path / "mine.tsv").write_text("".join(lines[: rows + 1]), encoding="utf-8")
    return tmp_path / "mine.tsv"


@pytest.mark.slow
def test_a_users_file_with_a_held_out_dev_split_and_no_test_reports_no_test_figures(tmp_path):
    """data.dev=holdout:0.2 and no data.test: a fifth of the user's rows held out (the same draw
    when derived again: every rank, every resume), trained on no more; dev figures, no test ones;
    the run says where dev came from and that it has no test split."""
    from pipeline.data import features, holdout
    from pipeline.runtime.world import Runtime
    from pipeline.tasks import get_task

    mine, db = own_sentiment_file(tmp_path), tracking_db(tmp_path)
    figures = run(load_config(None, [*FAST, "train.epochs=1", f"data.train={mine}", "data.dev=holdout:0.2",
                                     f"output_dir={tmp_path / 'out'}", f"tracking.uri=sqlite:///{db}"]))
    assert names.EVAL_MAIN in figures and not [k for k in figures if k.startswith(names.TEST)]
    (mlrun,) = mlflow_runs(db, "pipeline")
    assert mlrun.data.tags[names.TAG_DEV] == "holdout:0.2:0" and mlrun.data.tags[names.TAG_NO_TEST] == "true"
    logged = {i.tags[0].value: i.dataset for i in mlrun.inputs.dataset_inputs}  # context tag: the split
    assert set(logged) == {"train", "dev"} and logged["dev"].name == "mine.tsv (holdout:0.2:0)"

    task, rt = get_task("sentiment", {}), Runtime("none", "single", 0, 0, 1, 1, torch.device("cpu"))
    kept, held = holdout.hold_out(task, features.prepare_train(task, str(mine), rt), 0.2, 0, rt)
    assert (len(kept), len(held)) == (240, 60)
    assert (logged["train"].digest, logged["dev"].digest) == (kept.digest, held.digest)  # the rows the job used
    held_ids, kept_ids = set(held.dataset()["id"]), set(kept.dataset()["id"])
    assert held_ids.isdisjoint(kept_ids) and len(held_ids | kept_ids) == 300  # nothing held out is trained on
    assert "No test split" in (tmp_path / "out" / "report.txt").read_text()
    assert "| data: test | none (unset" in (tmp_path / "out" / "best" / "README.md").read_text()
    (written,) = (tmp_path / "out" / "predictions").iterdir()  # the held-out rows' predictions, no test file
    assert written.name == "dev.jsonl" and {row["id"] for row in predictions.read(written).rows} == held_ids


@pytest.mark.slow
def test_no_dev_evaluation_keeps_the_last_model(tmp_path):
    mine, db = own_sentiment_file(tmp_path), tracking_db(tmp_path)
    test_file = tmp_path / "samples" / "test.tsv"
    figures = run(load_config(None, [*FAST, "train.epochs=2", f"data.train={mine}", "data.dev=skip",
                                     f"data.test={test_file}", f"output_dir={tmp_path / 'out'}",
                                     f"tracking.uri=sqlite:///{db}"]))
    assert names.TEST_MAIN in figures and not [k for k in figures if k.startswith(names.EVAL)]
    assert figures[names.BEST_EPOCH] == 2  # the last epoch's model is the one kept and tested
    (mlrun,) = mlflow_runs(db, "pipeline")
    assert mlrun.data.tags[names.TAG_DEV] == "skip" and names.TAG_NO_TEST not in mlrun.data.tags
    assert mlrun.data.tags[names.TAG_BEST_REASON] == "the last model: no dev evaluation (data.dev=skip)"
    assert (tmp_path / "out" / "best" / "model.safetensors").is_file()
    assert [p.name for p in (tmp_path / "out" / "predictions").iterdir()] == ["test.jsonl"]  # no dev split, no dev file
