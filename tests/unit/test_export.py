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
    verdict(tmp_path / "model.onnx", {"max_abs_diff": 2e-6, "logit_scale": 8.0, "agreement": 1.0})
    for bad in ({"max_abs_diff": 0.0, "logit_scale": 1.0, "agreement": (int(100 * FP32_AGREEMENT) - 1) / 100},
                {"max_abs_diff": 0.5, "logit_scale": 8.0, "agreement": 1.0}):
        with pytest.raises(UserError) as e:
            verdict(tmp_path / "model.onnx", bad)
        assert len(str(e.value).splitlines()) == 1 and "model.onnx disagrees with the PyTorch model" in str(e.value)


def test_a_graph_beside_no_export_record_is_refused(tmp_path):
    from pipeline.export.onnx_model import served_graph

    (tmp_path / "model.onnx").write_bytes(b"")
    with pytest.raises(UserError, match="no export.json beside it"):
        served_graph(str(tmp_path / "model.onnx"))
