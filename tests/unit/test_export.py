"""An export checked against the model it came from (pipeline/export/check.py), on hand-made outputs:
agreement and the largest difference counted per output, per row (a class) or per real token (a
tag), and the fp32 graph refused in one line when it disagrees beyond tolerance."""

import pytest
import torch

from pipeline.errors import UserError
from pipeline.export.check import FP32_AGREEMENT, compare, verdict


class Fixed:
    """A model whose outputs are given: logits per batch, in order."""

    input_names, output_names = ["input_ids", "attention_mask"], ["logits"]

    def __init__(self, *logits):
        self.logits = list(logits)

    def __call__(self, **inputs):
        return {"logits": self.logits.pop(0)}


def batch(mask):
    mask = torch.tensor(mask)
    return {"input_ids": torch.ones_like(mask), "attention_mask": mask, "idx": torch.arange(len(mask))}


def test_agreement_per_row_and_per_real_token():
    rows = compare(Fixed(torch.tensor([[0.0, 1.0], [2.0, 0.0]])), Fixed(torch.tensor([[0.0, 1.5], [0.0, 2.0]])),
                   [batch([[1, 1], [1, 1]])])
    assert (rows["agreement"], rows["max_abs_diff"], rows["logit_scale"], rows["rows"]) == (0.5, 2.0, 2.0, 2)
    tokens = torch.tensor([[[0.0, 1.0], [1.0, 0.0], [1.0, 0.0]]])  # the last token is padding
    flipped = torch.tensor([[[0.0, 1.0], [1.0, 0.0], [0.0, 1.0]]])
    per_token = compare(Fixed(tokens), Fixed(flipped), [batch([[1, 1, 0]])])
    assert per_token["agreement"] == 1.0 and per_token["predictions"] == 2  # the padded token is not a prediction


def test_an_fp32_graph_that_disagrees_is_refused_in_one_line(tmp_path):
    verdict(tmp_path / "model.onnx", {"max_abs_diff": 2e-6, "logit_scale": 8.0, "agreement": 1.0}, "dev split")
    for bad in ({"max_abs_diff": 0.0, "logit_scale": 1.0, "agreement": (int(100 * FP32_AGREEMENT) - 1) / 100},
                {"max_abs_diff": 0.5, "logit_scale": 8.0, "agreement": 1.0}):
        with pytest.raises(UserError) as e:
            verdict(tmp_path / "model.onnx", bad, "dev split")
        assert len(str(e.value).splitlines()) == 1 and "model.onnx disagrees with the PyTorch model on the dev split" \
            in str(e.value)


def test_a_graph_beside_no_export_record_is_refused(tmp_path):
    from pipeline.export.onnx_model import served_graph

    (tmp_path / "model.onnx").write_bytes(b"")
    with pytest.raises(UserError, match="no export.json beside it"):
        served_graph(str(tmp_path / "model.onnx"))


@pytest.mark.parametrize("data, rows", [
    (["data.dev=skip"], "training rows (512 drawn: the stage has no dev or test split)"),
    (["data.dev=skip", "data.test=samples"], "test split (the stage has no dev split)"),
])
def test_the_rows_an_export_is_checked_on_are_named_as_what_they_are(tmp_path, monkeypatch, data, rows):
    """A stage without dev: its predictions are compared on its test split or a draw of its
    training rows, and the check's lines and check.json say which, never "dev"."""
    from pipeline.config import load_config
    from pipeline.export.check import stage_data
    from pipeline.fsutil import write_json
    from pipeline.job.plan import settle
    from pipeline.job.stage import build_stage
    from pipeline.layout import OutputDir
    from pipeline.runtime.world import Runtime
    from pipeline.tracking import finished_stage

    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    out = OutputDir(tmp_path / "out")
    cfg = load_config(None, ["model=preset:bangla-tiny", "train.max_length=32", f"output_dir={out.root}",
                             "data.train=samples", *data])
    built = build_stage(settle(cfg, "train", Runtime("none", "single", 0, 0, 1, 1, torch.device("cpu"))))
    out.root.mkdir()
    write_json(out.job, built.record.to_json())
    assert stage_data(finished_stage.read(out, "export --check"), built.tokenizer).rows == rows
