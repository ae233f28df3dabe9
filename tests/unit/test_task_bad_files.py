"""Every task's reader refuses a bad data file in one line that names the file, the row or line,
and the reason; nothing else is shown. The cases are each task's own (BAD_FILES in its test file)."""
import json

import pytest

from helpers import write_file
from pipeline.errors import UserError
from pipeline.tasks import get_task
from unit import test_task_error_cls, test_task_ner, test_task_qa, test_task_sentiment, test_task_wikiqa

CASES = [  # (task, task_options, file name, split, content, message)
    *[("error_cls", {"binary": binary}, "train.csv", "train", content, message)
      for content, message in test_task_error_cls.BAD_FILES for binary in (False, True)],
    *[("ner", {}, "train.json", "train", content, message) for content, message in test_task_ner.BAD_FILES],
    *[("qa", {}, "dev.json", "dev", content, message) for content, message in test_task_qa.BAD_FILES],
    *[("sentiment", {}, "train.tsv", "train", content, message) for content, message in test_task_sentiment.BAD_FILES],
    *[("wikiqa", {}, name, "train", content, message) for name, content, message in test_task_wikiqa.BAD_FILES],
]


@pytest.mark.parametrize("task, options, name, split, content, message", CASES)
def test_bad_files_name_file_row_and_reason(tmp_path, task, options, name, split, content, message):
    text = content if isinstance(content, str | bytes) else json.dumps(content, ensure_ascii=False)  # ner's rows
    path = write_file(tmp_path, text, name)
    with pytest.raises(UserError) as e:
        get_task(task, options).load(str(path), split)
    assert str(e.value).startswith(f"{path}: ") and message in str(e.value) and "\n" not in str(e.value)
