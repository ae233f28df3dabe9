"""The configuration's reference, read from the config dataclasses themselves: every dotted key
with its type, default and meaning, the meaning being the attribute docstring under the field in
pipeline/config/schema.py and sections.py, so that text is written once. It is what `train --help` and `distill --help`
print, and what docs/configuration.md holds, with the Hugging Face Trainer's names for these keys
(trainer_names.py, the table the unknown-key hint reads too).

Regenerate the page after changing a field: python -m pipeline config-reference > docs/configuration.md

Validation's near-miss hint is keys.py's: the schema imports that, not this module.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import types
import typing
from collections.abc import Iterator, Mapping
from typing import Any

from pipeline.config.keys import fields_of
from pipeline.config.schema import VALUE_FORMS, Config, choices
from pipeline.config.trainer_names import TRAINER_NAMES

PAGE = "docs/configuration.md"
REGENERATE = f"python -m pipeline config-reference > {PAGE}"
UNSET = "unset"  # the word the docstrings use for a None default
TRAINER_SECTION = "From the Hugging Face Trainer"

INTRO = """\
A stage's configuration is these keys' defaults, then the YAML file CONFIG.yaml if one is given (a
mapping of the same keys, sections nested: `train: {lr: 1.0e-4}`), then each `key=value` override
in the order given (dotted keys: `train.lr=1e-4`); a later value wins. The config file, if any, is
the first argument; every other argument is `key=value`. A value is read as its key's type: a
number, a string, a boolean (true/false, yes/no, on/off, 1/0); `null`, `none`, `~` or nothing
after the `=` unsets a key whose default is unset. Mapping keys (model_config, task_options,
tracking.tags) take any sub-key, its value read as YAML: `model_config.hidden_dropout_prob=0`.
Every key is checked before anything runs; a mistake (an unknown key, a wrong type, a value out of
range) is one line naming the key, exit code 2. A default shown as "unset" means what the key's
meaning says (often a value derived when the stage starts)."""


Key = tuple[str, str, str, str]
"""One configuration key as the reference shows it: (dotted key: train.lr, its type: the
annotation as written, the choices, or a mapping's KEY=VALUE form, its default, its meaning)."""


def sections() -> list[tuple[str, str, list[Key]]]:
    """The configuration's keys, grouped as (name, meaning, keys): the top-level keys first (name
    ""), then one section per nested dataclass."""
    top: list[Key] = []
    out = [("", "Keys at the top level of the configuration.", top)]
    for f, kind in fields_of(Config):
        if dataclasses.is_dataclass(kind):
            out.append((f.name, _meaning(Config, f.name), list(_keys(kind, f"{f.name}.", choices()))))
        else:
            top.append(_key(Config, f, kind, "", choices()))
    return out


def help_text(command: str) -> str:
    """`python -m pipeline train|distill --help`: the usage, how a configuration is put together,
    then every key with its default and meaning."""
    lines = [f"usage: python -m pipeline {command} [CONFIG.yaml] [key=value ...]", ""]
    if command == "distill":
        lines += ["One knowledge-distillation stage: kd.teacher is required; the student (model) is by default",
                  "from_teacher:N, the teacher with half of its layers (evenly spaced).", ""]
    else:
        lines += ["One training stage.", ""]
    lines += [INTRO, "", f"Every key, also in {PAGE} (KEY = DEFAULT  [TYPE], then its meaning):"]
    for name, meaning, keys in sections():
        lines += ["", f"{name or 'top level'}: {meaning}"]
        for key, kind, default, key_meaning in keys:
            lines.append(f"  {key} = {default}  [{kind}]")
            lines += textwrap.wrap(key_meaning, 100, initial_indent=" " * 6, subsequent_indent=" " * 6,
                                   break_on_hyphens=False, break_long_words=False)  # keep names whole
    return "\n".join(lines) + "\n"


def markdown() -> str:
    """docs/configuration.md: the same keys, a table per section."""
    lines = [f"<!-- Generated from the docstrings in pipeline/config/schema.py and sections.py by `{REGENERATE}`;",
             "     edit those and regenerate (tests/unit/test_cli_help.py fails while this page is stale). -->",
             "", "# Configuration", "", f"Regenerate this page with `{REGENERATE}`.",
             "Every key is also listed by `python -m pipeline train --help`.", "", INTRO]
    for name, meaning, keys in sections():
        lines += ["", f"## {f'`{name}`' if name else 'Top level'}", "", meaning, "",
                  "| key | type | default | meaning |", "|---|---|---|---|"]
        lines += [f"| `{key}` | {_cell(kind)} | {'*unset*' if default == UNSET else _cell(default)} "
                  f"| {_cell(key_meaning, code=False)} |" for key, kind, default, key_meaning in keys]
    return "\n".join([*lines, *_trainer_table()]) + "\n"


def _trainer_table() -> list[str]:
    """The section for Hugging Face Trainer users: each TrainingArguments name and its key here."""
    lines = ["", f"## {TRAINER_SECTION}", "", "What a Hugging Face `Trainer` user writes here instead of "
             "`TrainingArguments(...)`; an unknown key spelt as the Trainer spells it is answered with the key "
             "of this table.", "", "| TrainingArguments | here | what differs |", "|---|---|---|"]
    lines += [f"| {t.name} | {_cell(t.setting) if t.setting else '*none*'} | {_cell(t.differs, code=False)} |"
              for t in TRAINER_NAMES]
    return lines


# ---------------------------------------------------------------- internals


def _keys(cls: type, prefix: str, choices: Mapping[str, tuple[str, ...]]) -> Iterator[Key]:
    for f, kind in fields_of(cls):
        yield _key(cls, f, kind, prefix, choices)


def _key(cls: type, f: dataclasses.Field, kind: Any, prefix: str, choices: Mapping[str, tuple[str, ...]]) -> Key:
    key = prefix + f.name
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    if key in choices:
        kind_text = " | ".join(choices[key])
    elif key in VALUE_FORMS:
        kind_text = VALUE_FORMS[key]
    elif kind is dict:
        kind_text = f"mapping: {key}.KEY=VALUE"
    else:
        kind_text = _type_name(kind)
    return key, kind_text, _show(default), _meaning(cls, f.name)


def _type_name(kind: Any) -> str:
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        return " | ".join(_type_name(a) for a in typing.get_args(kind))
    if typing.get_origin(kind) is typing.Literal:
        return " | ".join(map(str, typing.get_args(kind)))
    return "None" if kind is type(None) else kind.__name__


def _show(value: Any) -> str:
    """A default as it is written in an override (true, not True), an unset one as "unset"."""
    if value is None:
        return UNSET
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _meaning(cls: type, name: str) -> str:
    """The field's docstring on one line; "" if it has none (tests/unit/test_cli_help.py fails then)."""
    return " ".join(_field_docs(cls).get(name, "").split())


@functools.cache
def _field_docs(cls: type) -> dict[str, str]:
    """Each field's attribute docstring: the string literal right below the annotated assignment
    (Python keeps no such docstring at run time, so it is read from the class's source)."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    docs = {}
    for node, after in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def _cell(text: str, code: bool = True) -> str:
    """A Markdown table cell: a pipe would end the cell, so it is escaped (also inside code)."""
    text = text.replace("|", "\\|")
    return f"`{text}`" if code else text
