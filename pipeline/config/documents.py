"""The one reader of the files a user names (a config, a study, a DeepSpeed JSON): their content, or
a one-line UserError naming the file and why."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from pipeline.errors import UserError


def read_document(path: Path, named: str, kind: str = "YAML") -> Any:
    """A YAML or JSON (`kind`) file's content: the one reader of the files a user names (a config,
    a study, a DeepSpeed config); a one-line UserError naming it as `named` when it is missing or
    does not parse."""
    if not path.is_file():
        raise UserError(f"{named}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
        return json.loads(text) if kind == "JSON" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{named}: not valid {kind} ({' '.join(str(e).split())})") from None
