"""`make wheelhouse HAVE=FILE` (launch/wheelhouse.py): from a node's `pip freeze`, only the wheels the node
lacks or holds at a version the pipeline refuses. Checked against the GPU check's node
(benchmarks/gpu-node-packages.txt: torch 2.11.0, transformers 5.17.0, tokenizers 0.23.2, no deepspeed,
mlflow, datasets, seqeval or normalizer), on pip's resolution report as it gives it (no index here)."""
import importlib.util
import sys

import pytest

from helpers import ROOT

NODE = ROOT / "benchmarks" / "gpu-node-packages.txt"


def wheelhouse():
    spec = importlib.util.spec_from_file_location("wheelhouse", ROOT / "launch" / "wheelhouse.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["wheelhouse"] = module
    spec.loader.exec_module(module)
    return module


def direct_requirements() -> list[str]:
    """pyproject.toml's dependencies and the GPU check's (launch/node_ready.py reads them)."""
    spec = importlib.util.spec_from_file_location("node_ready", ROOT / "launch" / "node_ready.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.requirements()


def item(name: str, version: str) -> dict:
    return {"metadata": {"name": name, "version": version}}


def test_a_freeze_reads_as_versions_and_bare_names(tmp_path):
    wh = wheelhouse()
    have = wh.read_have(NODE)
    assert len(have) == 197 and sum(v is not None for v in have.values()) == 30
    assert (have["torch"], have["transformers"], have["tokenizers"]) == ("2.11.0", "5.17.0", "0.23.2")
    assert have["pyyaml"] is None and have["nvidia-ml-py"] is None and "deepspeed" not in have
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("# a comment\nTorch==2.11.0+cu130\n-e git+https://example.org/x#egg=x\nfoo @ file:///tmp/foo\n"
                      "Typing_Extensions\n\n")
    assert wh.read_have(freeze) == {"torch": "2.11.0", "typing-extensions": None}
    freeze.write_text("torch>=2\n")
    with pytest.raises(SystemExit, match="torch>=2"):
        wh.read_have(freeze)


def test_the_nodes_pins_constrain_the_resolution_except_those_the_pipeline_refuses():
    wh = wheelhouse()
    constraints = wh.constraints_from(wh.read_have(NODE), direct_requirements())
    assert "torch==2.11.0" in constraints and "transformers==5.17.0" in constraints and "numpy==2.5.2" in constraints
    assert not any(c.startswith("tokenizers") for c in constraints)  # 0.23.2 < the floor 0.23.3: replaced
    assert len(constraints) == 29 and all("==" in c for c in constraints)  # bare names constrain nothing


def test_only_what_the_node_lacks_or_holds_refused_goes_into_the_folder():
    wh = wheelhouse()
    resolved = [item("tokenizers", "0.23.3"), item("transformers", "5.17.0"), item("deepspeed", "0.19.8"),
                item("PyYAML", "6.0.3"), item("numpy", "2.5.2"), item("mlflow", "3.17.2"), item("psutil", "7.1.0"),
                item("huggingface_hub", "1.33.0")]
    kept = [i["metadata"]["name"] for i in wh.missing(resolved, wh.read_have(NODE))]
    assert kept == ["tokenizers", "deepspeed", "mlflow"]  # pyyaml, psutil: bare names, counted as held


def test_a_conflict_names_the_nodes_pins_that_must_be_replaced():
    """pip's explanation of a node holding pyarrow 26 and pandas 3, which no mlflow accepts together."""
    wh = wheelhouse()
    output = """    mlflow 3.17.0 depends on pyarrow<26 and >=4.0.0
    mlflow 3.15.2 depends on pandas<3
    The user requested (constraint) pandas==3.1.1
    The user requested (constraint) PyArrow==26.0.1
ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/en/latest/topics/dependency-resolution/"""
    assert wh.conflicting(output) == ["pandas", "pyarrow"]
    assert wh.conflicting("ERROR: No matching distribution found for deepspeed==9") == []
