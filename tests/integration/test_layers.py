"""The import layers of docs/ARCHITECTURE.md, enforced: a module imports only from its own layer or
lower ones (every import counts: at the top, inside a function, under TYPE_CHECKING, relative, or
by name through importlib), inside each package only from its own inner layer or lower ones (the
order its __init__ docstring gives), no two modules import each other through any chain, and the
config layer loads without torch."""
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
