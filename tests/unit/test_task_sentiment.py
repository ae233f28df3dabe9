"""The BLP-2023 sentiment reader and metrics: real format, one-line errors, hand-computed scores;
the sample set's structure, and that it leaves room between seeds."""
import numpy as np
import pytest

from helpers import write_file, written_twice
from pipeline.errors import UserError
from pipeline.tasks import get_task
from pipeline.tasks.samples.sentiment import NEGATIVE, POSITIVE

TASK = get_task("sentiment")


def write(tmp_path, content, name="train.tsv"):
    return write_file(tmp_path, content, name)


def test_reads_the_tsv_format_and_normalizes(tmp_path):
    path = write(tmp_path, "id\ttext\tlabel\n7\tখুব   ভালো!\tpositive\n8\tখারাপ\tNegative\n")
    examples = TASK.load(str(path), "train")
    assert examples == [{"id": "7", "text": "খুব ভালো!", "label": 0}, {"id": "8", "text": "খারাপ", "label": 1}]


BAD_FILES = [  # (content, message): tests/unit/test_task_bad_files.py
    ("id\ttext\n1\tভালো\n", "missing column(s) label (found: id, text)"),
    ("id\tsentence\tlabel\n1\tভালো\tPositive\n", "missing column(s) text"),
    ("id\ttext\tlabel\n1\tভালো\tPositive\n2\t \tNegative\n", "line 3: empty text"),
    ("id\ttext\tlabel\n1\tভালো\tMixed\n", "line 2: unknown label 'Mixed'"),
    ("id\ttext\tlabel\n", "no data rows"),
    ("", "empty file"),
    (b"id\ttext\tlabel\n1\t\xff\xfe\tPositive\n", "line 2: not UTF-8 text"),
]


def test_missing_file_names_the_key(tmp_path):
    with pytest.raises(UserError, match=r"data.dev=.*nope.tsv: no such file"):
        TASK.load(str(tmp_path / "nope.tsv"), "dev")


def test_metrics_against_hand_computed_values():
    examples = [{"label": l} for l in [0, 0, 1, 1, 2, 2]]
    logits = np.eye(3)[[0, 1, 1, 1, 2, 0]]  # predictions 0,1,1,1,2,0
    m = TASK.metrics({"logits": logits}, examples, None)
    # per class F1: c0 P=1/2 R=1/2 -> .5 ; c1 P=2/3 R=1 -> .8 ; c2 P=1 R=1/2 -> 2/3
    assert m["accuracy"] == pytest.approx(4 / 6)
    assert m["macro_f1"] == pytest.approx((0.5 + 0.8 + 2 / 3) / 3)
    assert m["micro_f1"] == pytest.approx(4 / 6)
    assert TASK.tie_breakers == ("accuracy",)
    assert set(m) == set(TASK.metric_names())  # what a search's objective is checked against


def test_a_prediction_row_names_gold_and_predicted_class_with_each_class_probability():
    examples = [{"id": "c1", "label": 0}, {"id": "c2", "label": 2}]
    logits = np.log(np.array([[0.7, 0.2, 0.1], [0.125, 0.5, 0.375]], dtype=np.float32)) + 3.0
    assert TASK.prediction_rows({"logits": logits}, examples, None) == [
        {"id": "c1", "gold": "Positive", "pred": "Positive", "probs": [0.7, 0.2, 0.1]},
        {"id": "c2", "gold": "Neutral", "pred": "Negative", "probs": [0.125, 0.5, 0.375]}]
    assert TASK.prediction_labels() == ["Positive", "Negative", "Neutral"]  # the order of probs


def test_sample_set_is_deterministic_balanced_and_noisy(tmp_path):
    a = written_twice(TASK, tmp_path)
    examples = TASK.load(str(a["train"]), "train")
    counts = np.bincount([e["label"] for e in examples], minlength=3)
    assert counts.min() > 0.25 * len(examples)


def words(text):
    return set(text.replace(",", " ").replace("?", " ").replace("।", " ").split())


def test_no_single_cue_decides_the_label():
    """Opinion words, negation and contrast words each occur under several labels: where they
    sit decides, so a model has to read the structure (the issue's weak, overlapping cues)."""
    examples = TASK.load(None, "train")
    labels = {cue: set() for cue in ("কিন্তু", "না", "দেখিনি", *POSITIVE[:3], *NEGATIVE[:3])}
    for e in examples:
        for cue in words(e["text"]) & set(labels):
            labels[cue].add(e["label"])
    assert all(len(seen) >= 2 for seen in labels.values()), labels
    # neutral comments that mention an opinion word (questions, hearsay, conditions)
    neutral = [e for e in examples if e["label"] == 2]
    opinionated = [e for e in neutral if words(e["text"]) & set(POSITIVE + NEGATIVE)]
    assert len(opinionated) > 0.4 * len(neutral)
    # contrasts: both polarities in one polar comment
    mixed = [e for e in examples if e["label"] < 2 and words(e["text"]) & set(POSITIVE)
             and words(e["text"]) & set(NEGATIVE)]
    assert len(mixed) > 0.07 * sum(e["label"] < 2 for e in examples)
