"""A stalled run is named as such: each task's test for collapsed predictions on
hand-built predictions (one class for every row, a common class never predicted, no candidate
called correct, no entity), and the run's tags and warning line."""
import logging

import numpy as np

from pipeline import names
from pipeline.evaluation import Evaluation
from pipeline.measure import collapse
from pipeline.tasks import get_task
from pipeline.tasks.base import missing_classes


def logits_for(classes, n=3):
    """One-hot logits whose argmax is each row's class."""
    return {"logits": np.eye(n, dtype=np.float32)[classes]}


def examples(labels):
    return [{"label": label} for label in labels]


def test_missing_classes_one_class_for_every_row():
    assert missing_classes(np.array([1, 1, 1, 1]), np.array([0, 1, 2, 1]), 3) == [0, 2]
    # a rare gold class counts too when every row got the same class
    assert missing_classes(np.array([0] * 10), np.array([0] * 9 + [1]), 2) == [1]


def test_missing_classes_a_common_class_never_predicted():
    gold = np.array([0] * 4 + [1] * 4 + [2] * 4)
    assert missing_classes(np.array([0] * 4 + [1] * 8), gold, 3) == [2]
    # 1 of 12 rows is below half a uniform share (12 / (2 * 3) = 2 rows): a weak model, not a collapsed one
    rare = np.array([0] * 6 + [1] * 5 + [2])
    assert missing_classes(np.array([0] * 6 + [1] * 6), rare, 3) == []
    assert missing_classes(gold, gold, 3) == []
    # a split whose gold labels hold one class: predicting it is no collapse
    assert missing_classes(np.array([1, 1]), np.array([1, 1]), 3) == []


def test_sentiment_names_the_classes_predicted_and_missed():
    """The demo's stall: Neutral learned, Positive and Negative merged (macro-F1 about 0.53)."""
    task = get_task("sentiment")  # labels Positive, Negative, Neutral
    gold = [0, 0, 1, 1, 2, 2]
    assert task.stall(logits_for([0, 0, 0, 0, 2, 2]), examples(gold), None) == \
        "predicts only Positive, Neutral, never Negative"
    assert task.stall(logits_for([2] * 6), examples(gold), None) == "predicts only Neutral, never Positive, Negative"
    assert task.stall(logits_for([0, 1, 1, 1, 2, 0]), examples(gold), None) is None


def test_wikiqa_no_candidate_or_every_candidate_called_correct():
    task = get_task("wikiqa")
    gold = examples([1, 0, 0, 0, 1, 0])
    assert task.stall({"score": np.array([-1.0, -2, -3, -0.5, -0.1, -4])}, gold, None) == \
        "no candidate predicted correct"
    # a score of exactly 0 is "incorrect", as in metrics()
    assert task.stall({"score": np.zeros(6)}, gold, None) == "no candidate predicted correct"
    assert task.stall({"score": np.ones(6)}, gold, None) == "every candidate predicted correct"
    assert task.stall({"score": np.array([2.0, -1, -1, -1, -1, -1])}, gold, None) is None


def test_ner_no_entity_predicted():
    task = get_task("ner")
    o, b_symptom = task.labels.index("O"), task.labels.index("B-Symptom")
    gold = [{"tags": ["B-Symptom", "O"]}, {"tags": ["O", "O"]}]
    features = {"word_starts": [[1, 2], [1, 2]]}  # each word's first sub-word position

    def predicted(*rows):
        return {"token_labels": np.array([[-100, a, b, -100] for a, b in rows])}

    assert task.stall(predicted((o, o), (o, o)), gold, features) == "no entity predicted"
    assert task.stall(predicted((o, o), (b_symptom, o)), gold, features) is None  # wrong, but not collapsed
    assert task.stall(predicted((o, o), (o, o)), [{"tags": ["O", "O"]}], {"word_starts": [[1, 2]]}) is None


class Tags:
    def __init__(self):
        self.tags = {}

    def set_tags(self, tags):
        self.tags.update(tags)


def test_a_stalled_run_is_tagged_and_warned_about(caplog):
    tracker = Tags()
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        tracker.set_tags(collapse.flag(Evaluation({"main": 0.53}, stall="no entity predicted").stall, "test", True))
    assert tracker.tags == {names.TAG_STALLED: "true", names.TAG_STALL_REASON: "no entity predicted"}
    assert [r.getMessage() for r in caplog.records] == [
        "stalled: the best model's test predictions collapsed (no entity predicted); this run's scores compare "
        "no recipe"]


def test_a_run_that_learned_is_tagged_not_stalled_and_silent(caplog):
    tracker = Tags()
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        tracker.set_tags(collapse.flag(Evaluation({"main": 0.9}).stall, "test", True))
        Tags().set_tags(collapse.flag(Evaluation({"main": 0.5}, stall="no entity predicted").stall, "test", False))
    assert tracker.tags == {names.TAG_STALLED: "false"} == collapse.tags(None)
    assert not caplog.records  # only the main rank warns
