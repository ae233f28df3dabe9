"""Which evaluation is the best model: the main metric, then the task's tie-breakers, then the dev
loss; and what a checkpoint keeps of that choice."""
from __future__ import annotations

import math

import torch

from pipeline import names
from pipeline.job.parts.best_model import BestModel, beats

WIKIQA = ("f1", "map", "mrr")


def scores(f1, map_, mrr, loss):
    return {"f1": f1, "map": map_, "mrr": mrr, "loss": loss}


def test_a_tie_on_the_main_metric_goes_to_the_second():
    # a WikiQA run that calls no candidate correct yet after either epoch, while it ranks better
    assert beats(scores(0.0, 0.784, 0.80, 0.365), scores(0.0, 0.700, 0.81, 0.438), WIKIQA) == \
        "tie on f1 0.0000: map 0.7840 > 0.7000"
    assert beats(scores(0.0, 0.690, 0.99, 0.100), scores(0.0, 0.700, 0.81, 0.438), WIKIQA) is None


def test_a_tie_on_every_metric_goes_to_the_lower_dev_loss():
    earlier = scores(0.0, 0.7, 0.8, 0.438)
    assert beats(scores(0.0, 0.7, 0.8, 0.365), earlier, WIKIQA) == \
        "tie on f1 0.0000, map 0.7000, mrr 0.8000: loss 0.3650 < 0.4380"
    assert beats(scores(0.0, 0.7, 0.8, 0.500), earlier, WIKIQA) is None
    assert beats(dict(earlier), earlier, WIKIQA) is None  # no evidence at all: the earlier model stays


def test_a_strictly_higher_main_metric_wins_whatever_the_others_say():
    best = scores(0.40, 0.90, 0.95, 0.30)
    assert beats(scores(0.41, 0.50, 0.50, 0.90), best, WIKIQA) == "f1 0.4100 > 0.4000"
    assert beats(scores(0.39, 0.99, 0.99, 0.10), best, WIKIQA) is None


def test_the_first_evaluation_is_best_unless_its_main_metric_is_nan():
    assert beats(scores(0.0, 0.7, 0.8, 0.4), None, WIKIQA) == "first evaluation (f1 0.0000)"
    assert beats(scores(math.nan, 0.7, 0.8, 0.4), None, WIKIQA) is None


def test_nan_is_worse_than_any_number_and_a_missing_metric_is_skipped():
    assert beats(scores(0.5, math.nan, 0.9, 0.1), scores(0.5, 0.6, 0.1, 0.9), WIKIQA) is None
    assert beats(scores(0.5, 0.6, 0.2, 0.9), scores(0.5, 0.6, 0.1, math.nan), WIKIQA) == \
        "tie on f1 0.5000, map 0.6000: mrr 0.2000 > 0.1000"
    # QA windows give no dev loss: a tie on the metrics keeps the earlier model
    assert beats({"f1": 0.3, "exact": 0.2}, {"f1": 0.3, "exact": 0.2}, ("f1", "exact")) is None


class Weights:
    """The backend as BestModel reads it off the main rank (no best/ is written there)."""

    def __init__(self):
        self.value = 0.0

    def full_state_dict(self):
        return {"w": torch.tensor([self.value])}


def consider(best, backend, epoch, evaluation):
    backend.value = float(epoch)
    return best.consider({**evaluation, "main": evaluation["f1"]}, epoch, 10.0 * epoch, backend, None, None,
                         is_main=False)


def test_the_best_model_keeps_the_tie_breaks_choice_its_epoch_and_why_across_a_checkpoint():
    best, backend = BestModel(order=WIKIQA), Weights()
    assert consider(best, backend, 1, scores(0.0, 0.700, 0.75, 0.438))
    assert consider(best, backend, 2, scores(0.0, 0.784, 0.80, 0.365))  # the tie-break: epoch 2's weights
    assert (best.epoch, best.bad_evals, best.time_to_best, float(best.weights["w"])) == (2, 0, 20.0, 2.0)
    assert best.reason.startswith(names.TIE_BREAK) and best.metrics[names.eval_metric("map")] == 0.784

    restored = BestModel(order=WIKIQA)  # a resumed job: the order is the task's, the rest the checkpoint's
    restored.load_state_dict(best.state_dict())
    assert restored.state_dict() == best.state_dict()
    assert not consider(restored, backend, 3, scores(0.0, 0.784, 0.80, 0.370))  # ties then a higher loss
    assert (restored.epoch, restored.bad_evals) == (2, 1)
    assert consider(restored, backend, 4, scores(0.1, 0.5, 0.5, 0.9))
    assert (restored.epoch, restored.reason) == (4, "f1 0.1000 > 0.0000")


def test_a_checkpoint_saved_without_epoch_and_reason_still_loads_and_breaks_ties():
    state = {"score": 0.0, "metrics": {names.eval_metric(k): v for k, v in scores(0.0, 0.7, 0.8, 0.4).items()},
             "time_to_best": 5.0, "bad_evals": 0}
    best = BestModel(order=WIKIQA)
    best.load_state_dict(state)
    assert (best.epoch, best.reason) == (None, "")
    assert consider(best, Weights(), 2, scores(0.0, 0.8, 0.8, 0.4))
    assert best.reason == "tie on f1 0.0000: map 0.8000 > 0.7000"
