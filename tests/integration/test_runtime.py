"""Runtime paths that a GPU job takes, checked as far as a CPU can: the tests that train a model or
start a process (the others are in tests/unit/test_runtime.py)."""

import pytest
import torch
from torch.utils.data import DataLoader

from pipeline import models
from pipeline.evaluation import evaluate
from pipeline.runtime.precision import PrecisionPolicy
from pipeline.runtime.world import Runtime
from pipeline.tasks import get_task

CPU = Runtime("none", "single", 0, 0, 1, 1, torch.device("cpu"))


class LazyScale(torch.nn.Module):
    """A model that builds a buffer on its first forward, as rotary caches and ZeRO-3's gathered
    parameters are built: if that forward is an evaluation, training must still use the buffer."""

    def __init__(self, model):
        super().__init__()
        self.model, self.scale = model, None

    def forward(self, **inputs):
        if self.scale is None:
            self.scale = torch.full((self.model.config.num_labels,), 2.0)
        outputs = self.model(**{k: v for k, v in inputs.items() if k != "labels"})
        outputs.logits = outputs.logits * self.scale
        outputs.loss = torch.nn.functional.cross_entropy(outputs.logits, inputs["labels"])
        return outputs


@pytest.mark.slow  # trains a preset tokenizer
def test_a_training_step_after_evaluation_can_use_what_evaluation_cached():
    task = get_task("sentiment")
    examples = task.load(None, "dev")[:16]
    tokenizer, model = models.build("preset:bangla-tiny", task, task.texts(task.load(None, "train")), {}, 32)
    features = task.featurize(examples, tokenizer, 32, "dev")
    loader = DataLoader(features, batch_size=8, collate_fn=task.collator(tokenizer))
    module = LazyScale(model)
    scores = evaluate(module, loader, task, PrecisionPolicy("fp32", "cpu"), CPU, examples, features)
    assert 0.0 <= scores.main <= 1.0
    module.train()
    batch = next(iter(loader))
    batch.pop("idx")
    module(**batch).loss.backward()  # inference_mode would leave an inference tensor: "cannot be saved for backward"
    assert model.classifier.weight.grad is not None
