"""data.dev=holdout:F's parts carry their own texts (what a preset's tokenizer is trained on): the
task's texts of the part's rows, not a selection of the whole split's, which are not one per row."""
import pytest
import torch

from pipeline.data import features, holdout
from pipeline.runtime.world import Runtime
from pipeline.tasks import get_task

SINGLE = Runtime("none", "single", 0, 0, 1, 1, torch.device("cpu"))


@pytest.mark.parametrize("task_name", ["sentiment", "qa", "wikiqa"])
def test_each_part_has_the_texts_of_its_own_rows(tmp_path, monkeypatch, task_name):
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    task = get_task(task_name)
    kept, held = holdout.hold_out(task, features.prepare_train(task, None, SINGLE), 0.2, 0, SINGLE)
    for part in (kept, held):
        assert list(part.texts) == task.texts(part.examples())
    if task_name == "qa":  # the contexts a question is asked about are trained on, not only the questions
        assert {e["context"] for e in kept.examples()} <= set(kept.texts)
