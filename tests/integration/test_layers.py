"""The import layers of docs/ARCHITECTURE.md, enforced: the tests that train a model or start a process
(the others are in tests/unit/test_layers.py)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import ROOT

"""A package docstring's order of its own modules: names separated by spaces, layers by `|`."""


@pytest.mark.slow  # starts a Python process
def test_the_config_layer_loads_without_torch_or_transformers():
    code = ("import sys; import pipeline.config, pipeline.config.reference; "
            "print(sorted(m for m in ('torch', 'transformers', 'pipeline.tasks.base') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
