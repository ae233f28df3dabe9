"""The predictions file (pipeline/predictions.py): its header, one strict-JSON line per row, written
whole, read back as written; a file of another format or with rows missing is refused."""
import json

import pytest

from pipeline import predictions
from pipeline.errors import UserError
from pipeline.tasks.base import example_ids

HEADER = {"task": "sentiment", "split": "test", "labels": ["Positive", "Negative"], "data": "0123456789abcdef",
          "model": "preset:bangla-tiny", "precision": "bf16", "seed": 3}


def test_a_file_is_its_header_then_a_row_per_line_and_reads_back_as_written(tmp_path):
    path = tmp_path / "predictions" / "test.jsonl"
    rows = [{"id": "7", "gold": "Positive", "pred": "Negative", "probs": [0.25, 0.75]},
            {"id": "9", "gold": "Negative", "pred": "Negative", "probs": [0.0, 1.0]}]
    predictions.write(path, rows, **HEADER)

    lines = path.read_text(encoding="utf-8").splitlines()
    assert json.loads(lines[0]) == {"format": "pipeline.predictions/1", **HEADER, "rows": 2}
    assert [json.loads(line) for line in lines[1:]] == rows
    back = predictions.read(path)
    assert back.header["rows"] == 2 and back.rows == rows
    assert [p.name for p in path.parent.iterdir()] == ["test.jsonl"]  # no temporary left beside it


def test_text_is_written_as_utf8_and_a_number_that_is_not_finite_as_null(tmp_path):
    path = tmp_path / "dev.jsonl"
    answer = "ঢাকা\u2028শহর"  # a line separator inside a text ends no line of the file
    predictions.write(path, [{"id": "q1", "pred": answer, "score": float("-inf"), "null_score": float("nan"),
                              "gold": [answer], "has_answer": True}], **{**HEADER, "task": "qa", "labels": []})
    text = path.read_text(encoding="utf-8")
    assert "ঢাকা" in text and "NaN" not in text and "Infinity" not in text and text.count("\n") == 2
    (row,) = predictions.read(path).rows
    assert row["score"] is None and row["null_score"] is None and row["pred"] == answer


def test_a_file_of_another_format_or_with_rows_missing_is_refused(tmp_path):
    path = tmp_path / "test.jsonl"
    predictions.write(path, [{"id": "0"}, {"id": "1"}], **HEADER)
    path.write_text("".join(path.read_text(encoding="utf-8").splitlines(True)[:2]), encoding="utf-8")
    with pytest.raises(UserError, match="1 rows, its header says 2"):
        predictions.read(path)
    path.write_text(json.dumps({"format": "pipeline.predictions/0"}) + "\n", encoding="utf-8")
    with pytest.raises(UserError, match="not a predictions file this version reads"):
        predictions.read(path)


def test_rows_are_keyed_by_their_own_ids_where_these_are_distinct_else_by_row_number():
    assert example_ids([{"id": "b7"}, {"id": 12}]) == ["b7", "12"]
    assert example_ids([{"id": "a"}, {"id": "a"}]) == ["0", "1"]  # a repeated id would pair wrong rows
    assert example_ids([{"text": "x"}, {"text": "y"}]) == ["0", "1"]
