"""BaTEClaCor error classification: the CSV reader, both label sets, sklearn scores, learning end to end."""
import re

import numpy as np
import pytest

from helpers import write_file, written_twice
from pipeline.errors import UserError
from pipeline.tasks import get_task
from pipeline.tasks.samples.error_cls import BANGLISH, ENGLISH, FILLERS, GENITIVE, MISSPELLED

HEADER = "Comment,Error,Category\n"


def write(tmp_path, content, name="train.csv"):
    return write_file(tmp_path, content, name)


GOOD = ("Id,Comment,Error,Category,Correction\n"  # extra columns are fine
        '1,"আমি   প্রতিদিন বই পড়ি ।",0,,\n'
        "2,আমি প্রতিদিন বই পড়ে,1,grammatical,আমি প্রতিদিন বই পড়ি\n"
        "3,আমি প্রতিদীন বই পড়ি,1,Spelling,\n"
        "4,আমি daily বই পড়ি,1,code  switching,\n"
        "5,আমার daily বই পড়ে,1,Multiple Errors,\n")


def test_reads_the_csv_format_in_both_label_sets(tmp_path):
    path = write(tmp_path, GOOD)
    examples = get_task("error_cls").load(str(path), "train")
    assert [e["label"] for e in examples] == [0, 1, 2, 3, 4]
    assert examples[0]["text"] == "আমি প্রতিদিন বই পড়ি ।"  # normalized: spaces collapsed
    binary = get_task("error_cls", {"binary": True})
    assert [e["label"] for e in binary.load(str(path), "train")] == [0, 1, 1, 1, 1]
    assert binary.model_kwargs()["id2label"] == {0: "Correct", 1: "Error"}
    assert get_task("error_cls").model_kwargs()["id2label"] == {
        0: "Correct", 1: "Grammatical", 2: "Spelling", 3: "Code Switching", 4: "Multiple Errors"}


BAD_FILES = [  # (content, message): tests/unit/test_task_bad_files.py, under binary=false and true
    ("Comment,Error\nভালো,0\n", "missing column(s) Category (found: Comment, Error)"),
    ("Text,Error,Category\nভালো,0,\n", "missing column(s) Comment (found: Text, Error, Category)"),
    (HEADER + "ভালো,0,\n  ,0,\n", "line 3: empty comment"),
    (HEADER + "ভালো,0,\nভালো,1,Punctuation\n", "line 3: unknown category 'Punctuation' (expected Grammatical, "
                                                "Spelling, Code Switching, Multiple Errors, or empty for Correct)"),
    (HEADER + "ভালো,2,Spelling\n", "line 2: Error must be 0 or 1 (got '2')"),
    (HEADER + "ভালো,,\n", "line 2: Error must be 0 or 1 (got '')"),
    (HEADER + "ভালো,0,Spelling\n", "line 2: Error=0 but Category='Spelling' (a correct comment has an empty Category)"),
    (HEADER + "ভালো,1,\n", "line 2: Error=1 but Category='' (an error needs a Category)"),
    (HEADER, "no data rows"),
    ("", "empty file"),
    (b"Comment,Error,Category\n\xff\xfe,0,\n", "line 2: not UTF-8 text"),
]


@pytest.mark.parametrize("options, message", [
    ({"binray": True}, r"^config: task_options\.binray: unknown option for task error_cls \(available: binary\)$"),
    ({"binary": 2}, r"^config: task_options\.binary=2: must be true or false$"),
])
def test_bad_task_options_name_the_key(options, message):
    with pytest.raises(UserError, match=message):
        get_task("error_cls", options)


def test_hub_rows_are_checked_like_files():
    import datasets

    rows = datasets.Dataset.from_dict({"Comment": ["ভালো", "ভালো"], "Error": [0, 1], "Category": [None, None]})
    with pytest.raises(UserError, match=r"^hub:x: row 2: Error=1 but Category=''"):
        get_task("error_cls").from_hub_rows(rows, "hub:x")
    with pytest.raises(UserError, match=r"^hub:x: missing column\(s\) Category"):
        get_task("error_cls").from_hub_rows(datasets.Dataset.from_dict({"Comment": ["ভালো"], "Error": [0]}), "hub:x")


# ------------------------------------------------------------------ metrics


def test_five_class_metrics_against_hand_computed_values():
    task = get_task("error_cls")
    examples = [{"label": l} for l in [0, 0, 1, 2, 3, 4]]
    logits = np.eye(5)[[0, 1, 1, 2, 3, 0]]
    m = task.metrics({"logits": logits}, examples, None)
    # per class F1: Correct P 1/2 R 1/2 -> 1/2 ; Grammatical P 1/2 R 1 -> 2/3 ; Spelling 1 ; Code Switching 1 ;
    # Multiple Errors never predicted -> 0.   Supports 2,1,1,1,1.
    assert m["accuracy"] == pytest.approx(4 / 6)
    assert m["macro_f1"] == pytest.approx((1 / 2 + 2 / 3 + 1 + 1 + 0) / 5)
    assert m["weighted_f1"] == pytest.approx((2 * 1 / 2 + 2 / 3 + 1 + 1 + 0) / 6)
    assert set(m) == set(task.metric_names())  # what a search's objective is checked against
    report = task.report({"logits": logits}, examples, None)
    assert re.search(r"Multiple Errors\s+0\.0000\s+0\.0000\s+0\.0000\s+1\n", report)


def test_binary_metrics_against_hand_computed_values():
    task = get_task("error_cls", {"binary": True})
    examples = [{"label": l} for l in [0, 1, 1, 1]]
    m = task.metrics({"logits": np.eye(2)[[0, 1, 0, 1]]}, examples, None)
    # Correct P 1/2 R 1 -> 2/3 ; Error P 1 R 2/3 -> 4/5 ; supports 1, 3
    assert m == pytest.approx({"accuracy": 0.75, "macro_f1": (2 / 3 + 4 / 5) / 2,
                               "weighted_f1": (2 / 3 + 3 * 4 / 5) / 4})
    # a class absent from labels and predictions still counts in the macro average
    assert task.metrics({"logits": np.eye(2)[[1, 1]]}, [{"label": 1}] * 2, None)["macro_f1"] == pytest.approx(0.5)


def test_prediction_rows_of_comments_without_ids_are_keyed_by_row_number():
    task = get_task("error_cls", {"binary": True})
    rows = task.prediction_rows({"logits": np.array([[0.0, 2.0], [1.0, -1.0]])}, [{"label": 1}, {"label": 1}], None)
    assert [(r["id"], r["gold"], r["pred"]) for r in rows] == [("0", "Error", "Error"), ("1", "Error", "Correct")]
    assert rows[0]["probs"] == [0.1192, 0.8808]  # 4 decimals


# ------------------------------------------------------------------ sample set


def test_sample_set_is_deterministic_consistent_and_noisy(tmp_path):
    task = get_task("error_cls")
    a = written_twice(task, tmp_path)
    assert {p.name for p in a.values()} == {"train.csv", "dev.csv", "test.csv"}
    examples = task.load(str(a["train"]), "train")  # every row passes the reader's checks
    counts = np.bincount([e["label"] for e in examples], minlength=5)
    assert len(examples) == 1500 and counts.min() > 0.1 * len(examples)
    # a comment with a visible error marker (an English word, a misspelling, a genitive subject)
    # labelled Correct can only be label noise: some, not many
    markers = (set(MISSPELLED.values()) | set(GENITIVE.values()) | {BANGLISH[g] for g in GENITIVE.values()}
               | {w for phrase in ENGLISH.values() for w in phrase.split() if w != "e"} | set(FILLERS))
    noisy = [e for e in examples if e["label"] == 0 and markers & set(re.findall(r"[^\s,।!.]+", e["text"]))]
    assert 5 < len(noisy) < 0.05 * len(examples)


def test_latin_script_is_a_weak_cue():
    """Banglish comments (romanized Bangla) are Latin script without being code-switched: a
    model must know the words, not the script (issue 16)."""
    examples = get_task("error_cls").load(None, "train")
    latin = [e for e in examples if re.search("[a-z]", e["text"])]
    banglish = [e for e in latin if not re.search("[\u0980-\u09ff]", e["text"])]
    assert len(banglish) > 0.1 * len(examples)
    by_label = np.bincount([e["label"] for e in banglish], minlength=5)
    assert by_label[0] > 0.15 * len(banglish) and by_label[3] > 0.1 * len(banglish)  # Correct, Code Switching
