"""`train --help` / `distill --help` list every config key from the dataclasses' docstrings; a
misspelt key or choice names the nearest valid one; docs/configuration.md is what the code says."""
import dataclasses
import re
import typing
from pathlib import Path

import pytest

from helpers import ROOT
from pipeline.cli import main
from pipeline.config import Config, load_config, reference
from pipeline.errors import UserError


def leaf_keys(obj: object, prefix: str = "") -> dict[str, str]:
    """{dotted key: default} of every non-section field, walked here apart from the module under test."""
    out = {}
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            out.update(leaf_keys(value, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = "unset" if value is None else str(value).lower() if isinstance(value, bool) \
                else str(value)
    return out


KEYS = leaf_keys(Config())


@pytest.mark.parametrize("argv", [["distill", "-h"], ["distill", "configs/none.yaml", "--help"], ["train", "-h"]])
def test_stage_help_in_process(argv: list[str], capsys: pytest.CaptureFixture[str]):
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m pipeline {argv[0]} ")
    assert ("kd.teacher is required" in out) == (argv[0] == "distill")
    assert all(f"\n  {key} = {default}  [" in out for key, default in KEYS.items())


def test_other_help_still_works(capsys: pytest.CaptureFixture[str]):
    assert main(["--help"]) == 0
    assert "config-reference" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:  # argparse's help
        main(["study", "--help"])
    assert e.value.code == 0 and "--dry-run" in capsys.readouterr().out


def test_unknown_key_names_the_nearest_one_in_one_line(capsys: pytest.CaptureFixture[str]):
    assert main(["train", "train.batch_sise=8"]) == 2
    assert capsys.readouterr().err == "error: config: unknown key 'train.batch_sise' (did you mean train.batch_size?)\n"


@pytest.mark.parametrize("override, message", [
    ("lr=1e-4", "unknown key 'lr' (did you mean train.lr?)"),  # the right name in another section
    ("kd.epochs=2", "unknown key 'kd.epochs' (did you mean train.epochs?)"),
    ("trian.lr=1", "unknown key 'trian' (did you mean train?)"),
    ("train.LR=1", "unknown key 'train.LR' (did you mean train.lr?)"),
    ("nosuch=1", "unknown key 'nosuch'"),  # nothing near: no guess
    ("precision=bf61",
     "precision=bf61: must be one of fp32 | tf32 | fp16 | bf16 | bf16-pure | auto (did you mean bf16?)"),
    ("precision=16", "(did you mean fp16 or bf16?)"),  # ties are all named
    ("train.compile=reduce_overhead", "(did you mean reduce-overhead?)"),
    ("task=sentimen", "(did you mean sentiment?)"),
    ("backend=", "backend=: must be one of auto | single | ddp | deepspeed (leave the key out for its default, auto)"),
    ("train.compile=", "(leave the key out for its default, auto)"),
    ("backend=horovod", "backend=horovod: must be one of auto | single | ddp | deepspeed"),
])
def test_near_misses(override: str, message: str):
    with pytest.raises(UserError) as e:
        load_config(None, [override])
    assert str(e.value).endswith(message) and "\n" not in str(e.value)


def test_near_miss_in_a_config_file(tmp_path: Path):
    path = tmp_path / "typo.yaml"
    path.write_text("train:\n  batch_sise: 8\nprecision: bf16\n")
    with pytest.raises(UserError, match=r"unknown key 'train.batch_sise' \(did you mean train.batch_size\?\)$"):
        load_config(str(path))


def test_the_reference_page_is_up_to_date(capsys: pytest.CaptureFixture[str]):
    assert main(["config-reference"]) == 0
    generated = capsys.readouterr().out
    assert generated == reference.markdown()
    page = (ROOT / reference.PAGE).read_text(encoding="utf-8")
    assert page == generated, f"{reference.PAGE} is stale; regenerate it: {reference.REGENERATE}"
    rows = {cells[1].strip(" `"): cells[3].strip() for line in page.splitlines() if line.startswith("| `")
            for cells in [re.split(r"(?<!\\)\|", line)]}  # an escaped pipe is part of a cell
    assert rows == {key: "*unset*" if default == "unset" else f"`{default}`" for key, default in KEYS.items()}
