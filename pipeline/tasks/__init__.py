"""The tasks: the Task interface (base), one module per task, the readers and worker processes they
share, and the built-in sample sets (samples/). This module is the registry: `task=NAME` -> what
makes the Task (its class, or a function of its options), imported on first use (so that reading
the names, as the config's validation does, costs no torch or transformers import).

May import: errors, names, fsutil, layout (below config, whose validation reads the registry's
names); this module itself only errors when loaded.

Inside, lowest first: readers workers samples | base | text_classification ner qa wikiqa | sentiment error_cls
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from pipeline.errors import UserError

if TYPE_CHECKING:
    from pipeline.tasks.base import Task

REGISTRY = {
    "sentiment": "pipeline.tasks.sentiment:task",
    "ner": "pipeline.tasks.ner:NerTask",
    "error_cls": "pipeline.tasks.error_cls:task",
    "qa": "pipeline.tasks.qa:QaTask",
    "wikiqa": "pipeline.tasks.wikiqa:WikiQaTask",
}


def get_task(name: str, options: dict | None = None) -> Task:
    if name not in REGISTRY:
        raise UserError(f"config: task={name}: unknown task (available: {', '.join(REGISTRY)})")
    module, _, attribute = REGISTRY[name].partition(":")
    try:
        make = getattr(importlib.import_module(module), attribute)
    except ModuleNotFoundError as e:
        if e.name != module:
            raise
        raise UserError(f"config: task={name}: not implemented in this version") from None
    return make(options)
