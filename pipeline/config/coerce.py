"""How a config value, from YAML or from key=value text, becomes its field's type; a value that
cannot is a UserError naming the key and the type expected."""
from __future__ import annotations

import types
import typing
from typing import Any

import yaml

from pipeline.errors import UserError


def coerce(key: str, value: Any, kind: Any, from_text: bool) -> Any:
    """Return value as `kind` or raise a UserError naming the key and the expected type."""
    optional = False
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        # a Literal member names words the key takes besides its type (train.batch_size=auto)
        words = [w for a in typing.get_args(kind) if typing.get_origin(a) is typing.Literal for w in typing.get_args(a)]
        if (value.strip() if from_text else value) in words:
            return value.strip() if from_text else value
        args = [a for a in typing.get_args(kind) if a is not type(None) and typing.get_origin(a) is not typing.Literal]
        optional = type(None) in typing.get_args(kind)
        kind = args[0]
    if from_text and optional and value.strip().lower() in ("null", "none", "~", ""):
        return None
    if value is None:
        if optional:
            return None
        raise UserError(f"config: {key}: must not be empty (expected {kind.__name__})")
    try:
        return _AS[kind](value, from_text)
    except ValueError:
        raise UserError(f"config: {key}={value!r}: expected {kind.__name__}") from None


def _as_bool(value: Any, from_text: bool) -> bool:
    if isinstance(value, bool):
        return value
    if from_text and value.strip().lower() in ("true", "yes", "1", "on"):
        return True
    if from_text and value.strip().lower() in ("false", "no", "0", "off"):
        return False
    raise ValueError


def _as_int(value: Any, from_text: bool) -> int:
    if isinstance(value, bool):
        raise ValueError
    if from_text:
        return int(value.strip())
    if isinstance(value, int):
        return value
    raise ValueError


def _as_float(value: Any, from_text: bool) -> float:
    if isinstance(value, bool):
        raise ValueError
    if from_text or isinstance(value, str):
        return float(value.strip())  # YAML reads 1e-4 as a string; float() does not
    if isinstance(value, (int, float)):
        return float(value)
    raise ValueError


def _as_str(value: Any, from_text: bool) -> str:
    if from_text:
        return value
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    raise ValueError


def _as_dict(value: Any, from_text: bool) -> dict:
    if from_text:
        value = yaml.safe_load(value)
    if isinstance(value, dict):
        return value
    raise ValueError


_AS = {bool: _as_bool, int: _as_int, float: _as_float, str: _as_str, dict: _as_dict}
"""A config field's type -> how a value (from YAML, or from key=value text) becomes it."""
