"""Task registry: `task=NAME` -> the Task class."""
from __future__ import annotations

from pipeline.errors import UserError
from pipeline.tasks.base import Task


def get_task(name: str, options: dict | None = None) -> Task:
    from pipeline.tasks.sentiment import SentimentTask

    registry = {cls.name: cls for cls in (SentimentTask,)}
    if name not in registry:
        raise UserError(f"config: task={name}: not implemented yet (available: {', '.join(registry)})")
    return registry[name](options)
