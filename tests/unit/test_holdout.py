"""data.dev=holdout:F as prepared data (data/holdout.py): the two parts are entries of their own,
with features of their own, and a task's groups of rows stay whole; a job without a test split
has no test figures in its final metrics or its study cell."""
import math
from types import SimpleNamespace

import pytest
import torch

from pipeline import names
from pipeline.data import features, holdout
from pipeline.models import preset_tokenizer
from pipeline.runtime.world import Runtime
from pipeline.tasks import get_task

SINGLE = Runtime("none", "single", 0, 0, 1, 1, torch.device("cpu"))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache of this test's own: a miss is a miss, whatever other tests prepared."""
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def sample_train(task, directory) -> str:
    """The task's built-in training set, written as a user's file."""
    directory.mkdir()
    return str(task.write_samples(directory)["train"])


def test_a_held_out_split_has_entries_and_features_of_its_own(cache, tmp_path):
    """Kept and held-out rows are disjoint and make up the file; the same draw is a cache hit;
    another fraction or seed is another entry; no side's features are the whole file's."""
    task = get_task("sentiment", {})
    spec = sample_train(task, tmp_path / "d")
    full = features.prepare_train(task, spec, SINGLE)
    kept, held = holdout.hold_out(task, full, 0.2, 0, SINGLE)
    kept_ids, held_ids = set(kept.dataset()["id"]), set(held.dataset()["id"])
    assert not kept_ids & held_ids and kept_ids | held_ids == set(full.dataset()["id"])
    assert len(held) == round(0.2 * len(full)) and len(list(kept.texts)) == len(kept)
    again = holdout.hold_out(task, full, 0.2, 0, SINGLE)
    assert [part.cache_outcome for part in again] == ["hit", "hit"]
    assert [part.digest for part in again] == [kept.digest, held.digest]
    others = [holdout.hold_out(task, full, 0.3, 0, SINGLE)[0], holdout.hold_out(task, full, 0.2, 1, SINGLE)[0]]
    assert len({full.key, kept.key, held.key, *(part.key for part in others)}) == 5
    tokenizer = preset_tokenizer(full.texts)
    prepared = [features.prepare_features(task, split, spec if rows is full else None, rows, tokenizer, 32, SINGLE)
                for split, rows in (("train", full), ("train", kept), ("dev", held))]
    assert [len(p) for p in prepared] == [len(full), len(kept), len(held)]
    assert len({p.key for p in prepared}) == 3


def test_wikiqa_holds_out_whole_questions(cache, tmp_path):
    task = get_task("wikiqa", {})
    full = features.prepare_train(task, sample_train(task, tmp_path / "d"), SINGLE)
    kept, held = holdout.hold_out(task, full, 0.2, 0, SINGLE)
    kept_q, held_q = set(kept.dataset()["qid"]), set(held.dataset()["qid"])
    assert held_q and not kept_q & held_q and len(kept) + len(held) == len(full)
    assert len(held_q) == round(0.2 * len(kept_q | held_q))


def test_final_metrics_without_a_test_split_have_no_test_figures():
    from pipeline.job import loop as job_loop
    from pipeline.job.parts.best_model import LAST, BestModel
    from pipeline.job.records.metrics import MetricsProcessor

    logged, tags = {}, {}
    processor = MetricsProcessor.__new__(MetricsProcessor)
    processor.tracker = SimpleNamespace(set_tags=tags.update, log_metrics=lambda m, step=None: logged.update(m))
    loop = SimpleNamespace(
        best=BestModel(epoch=2, reason=LAST), progress=SimpleNamespace(step=8, epoch=2),
        losses=SimpleNamespace(figures=lambda: {names.TRAIN_LOSS: 0.5}, amp_figures=lambda scale: {}),
        meters=SimpleNamespace(final_figures=lambda _: {names.SAMPLES_PER_S: 1.0}),
        stage=SimpleNamespace(backend=SimpleNamespace(loss_scale=None), rt=SimpleNamespace(is_main=True)))
    final = processor.log_final(8, *job_loop.final_figures(loop, None, {}))
    assert final[names.BEST_EPOCH] == 2 and not [k for k in (*final, *logged) if k.startswith(names.TEST)]
    assert names.TAG_STALLED not in tags and tags[names.TAG_BEST_REASON] == LAST


def test_a_study_cell_without_test_figures_reads_n_a_not_zero():
    """A finished run with no test/ metrics: its test columns are written n/a, its main figure is
    the best dev one; with no dev figures either, n/a too."""
    from pipeline.report.cells import _metrics
    from pipeline.report.tables import _value

    def run(metrics):
        return SimpleNamespace(data=SimpleNamespace(metrics=metrics, tags={}), info=SimpleNamespace(run_id="r"))

    client = SimpleNamespace(get_metric_history=lambda run_id, key: [SimpleNamespace(value=0.5),
                                                                     SimpleNamespace(value=0.7)])
    held = _metrics(client, run({names.EVAL_MAIN: 0.5, names.SAMPLES_PER_S: 10.0}))
    assert (held["main"], held["main_source"]) == (0.7, names.EVAL_MAIN) and held["test_scores"] == ""
    assert _value("ok", held["test_accuracy"]) == "n/a"
    neither = _metrics(client, run({names.SAMPLES_PER_S: 10.0}))
    assert _value("ok", neither.get("main", math.nan)) == "n/a"
