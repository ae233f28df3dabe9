"""Models train in fp32 whatever dtype a saved config names, and best/ is saved in fp32: the tests that
train a model or start a process (the others are in tests/unit/test_models.py)."""
import json
import os
import subprocess
import sys

import pytest

from pipeline import models
from pipeline.tasks import get_task


@pytest.mark.slow  # starts Python processes
def test_preset_tokenizer_is_the_same_in_every_process(tmp_path, monkeypatch):
    """The tokenizers library's WordPiece trainer orders "##x" tokens by a hash map seeded per
    process, so the same texts gave another vocabulary (and another trained model, for the same
    seed) in every process: the error-classification test's macro-F1 went 0.30-0.66 by it.
    Three processes (this one and two fresh ones), each training on a fresh cache."""
    texts = get_task("error_cls").texts(get_task("error_cls").load(None, "train"))
    (tmp_path / "texts.json").write_text(json.dumps(texts, ensure_ascii=False), encoding="utf-8")
    code = ("import json, sys; from pipeline.models import preset_tokenizer; "
            "print(json.dumps(preset_tokenizer(json.load(open(sys.argv[1], encoding='utf-8'))).get_vocab(), "
            "sort_keys=True))")
    vocabs = []
    for n in range(2):
        env = {**os.environ, "PIPELINE_CACHE": str(tmp_path / f"cache{n}")}
        out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "texts.json")], env=env,
                             capture_output=True, text=True, check=True).stdout
        vocabs.append(json.loads(out))
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache-here"))
    tokenizer = models.preset_tokenizer(texts)
    assert (tmp_path / "cache-here").is_dir()  # trained here, not read from the session's cache
    assert vocabs[0] == vocabs[1] == tokenizer.get_vocab()
    # "##x" are ordinary tokens: only the five specials are added (special) tokens
    assert sorted(tokenizer.all_special_tokens) == sorted(models.SPECIALS)
    assert tokenizer.tokenize("আমি প্রতিদিন") == ["আমি", "প্রতিদিন"]
    assert tokenizer.tokenize("মাছভাত")[:2] == ["মাছ", "##ভ"]  # an unseen word: pieces
