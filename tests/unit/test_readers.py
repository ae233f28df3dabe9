"""The shared readers refuse what they cannot read faithfully, in one line naming file, line and
field: rows with the wrong number of fields, oversized fields, a directory given as a file."""
import json

import pytest

from helpers import write_file
from pipeline.errors import UserError
from pipeline.tasks import get_task
from pipeline.tasks.readers import MAX_FIELD_CHARS

HEADER = "id\ttext\tlabel\n"
GOOD = "a1\tখুব ভালো লাগল\tpositive\n"


def load_sentiment(path):
    return get_task("sentiment").load(str(path), "train")


def test_a_row_with_extra_fields_is_refused_not_cut(tmp_path):
    path = write_file(tmp_path, HEADER + GOOD + "a2\tভালো\tpositive" + "\tx" * 9997 + "\n", "train.tsv")
    expected = rf"^{path}: line 3: 10000 fields, expected 3 \(tab-separated: id, text, label\)$"
    with pytest.raises(UserError, match=expected):
        load_sentiment(path)


def test_a_row_with_missing_fields_is_refused_not_padded(tmp_path):
    path = write_file(tmp_path, HEADER + GOOD + "a2\tভালো\n", "train.tsv")
    with pytest.raises(UserError, match=rf"^{path}: line 3: 2 fields, expected 3 "):
        load_sentiment(path)


def test_an_oversized_field_names_its_line_and_column(tmp_path):
    huge = "ভালো " * (5 * 2**20 // 5)  # 5 MB of characters, past csv's own 131072 limit too
    path = write_file(tmp_path, HEADER + GOOD + GOOD + f"a3\t{huge}\tpositive\n", "train.tsv")
    with pytest.raises(UserError, match=rf"^{path}: line 4: field 'text' is {len(huge):,} characters long, "
                                        rf"over the limit of {MAX_FIELD_CHARS:,}$"):
        load_sentiment(path)


def test_a_field_at_the_limit_is_read(tmp_path):
    text = "ক" * MAX_FIELD_CHARS
    path = write_file(tmp_path, HEADER + f"a1\t{text}\tpositive\n", "train.tsv")
    (example,) = load_sentiment(path)
    assert len(example["text"]) == MAX_FIELD_CHARS


def test_an_oversized_json_lines_field_is_refused(tmp_path):
    row = {"question_id": "q1", "question": "কে?", "answer": "x" * (MAX_FIELD_CHARS + 1), "label": 1}
    path = write_file(tmp_path, json.dumps(row, ensure_ascii=False) + "\n", "train.jsonl")
    with pytest.raises(UserError, match=rf"^{path}: line 1: field 'answer' is {MAX_FIELD_CHARS + 1:,} characters"):
        get_task("wikiqa").load(str(path), "train")


def test_a_directory_is_called_a_directory(tmp_path):
    with pytest.raises(UserError, match=rf"^data.train={tmp_path}: is a directory, expected a data file$"):
        load_sentiment(tmp_path)
    with pytest.raises(UserError, match=rf"^data.train={tmp_path / 'nope.tsv'}: no such file$"):
        load_sentiment(tmp_path / "nope.tsv")
