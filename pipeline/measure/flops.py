"""FLOPs of the micro-batches a job trains: counted once, outside the timed steps, on real
single-row steps of the model, and turned into a per-batch model that is exact for every shape; and
a model's size (ModelSize: parameters, forward FLOPs of one sequence) from its config alone."""
from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from pipeline import names


class FlopModel:
    """FLOPs of a training micro-batch from its shape, from counts made once outside the timer.

    In a transformer encoder every counted op (matmuls, attention) costs, per row, a polynomial
    of degree two in the padded length L: linear layers c1 L, attention c2 L^2, pooler and head
    c0; and each is linear in the rows. So `per_row` (padded length -> FLOPs of one row, counted
    with FlopCounterMode on real single-row steps at up to three lengths) fixes c0, c1, c2, and a
    batch of B rows padded to L costs B (c0 + c1 L + c2 L^2): exact for every shape, whatever the
    order of the batches (with length grouping the first one is the longest). With fewer distinct
    lengths the fit is exact at those, the only lengths a row can then have.

    The lengths counted are the rows' own (one row is never padded), so `rows` gives the FLOPs of a
    batch's real tokens (each row at its own length, as an unpadded kernel would compute it) and
    `batch` those of the batch as padded and computed."""

    def __init__(self, per_row: dict[int, float]):
        lengths = sorted(per_row)[:3]
        self.per_row = dict(per_row)
        self.coefficients = np.polyfit(lengths, [per_row[n] for n in lengths], len(lengths) - 1)

    def row(self, length: int) -> float:
        """FLOPs of one row of `length` tokens."""
        if length in self.per_row:
            return self.per_row[length]
        return float(np.polyval(self.coefficients, length))

    def batch(self, rows: int, length: int) -> float:
        """FLOPs of `rows` rows padded to `length`: what the device computes."""
        return rows * self.row(length)

    def rows(self, lengths: list[int]) -> float:
        """FLOPs of rows of these real lengths, each unpadded: the useful work of a batch."""
        return sum(self.row(n) for n in lengths)


def count_flops(step: Callable[[], object]) -> float:
    """FLOPs of `step()` (forward and backward of one micro-batch) as torch's FlopCounterMode
    counts them (matmuls and attention, backward included)."""
    with FlopCounterMode(display=False) as counter:
        step()
    return float(counter.get_total_flops())


def step_flop_model(model: torch.nn.Module, lengths: list[int], row_batch: Callable[[int], dict],
                    step: Callable[[dict], None], device: torch.device) -> FlopModel:
    """FLOPs of one training row at up to three padded lengths (the shortest, the longest and one
    between), each counted on a real single-row forward and backward (`step`, the loss included),
    in eval mode with the math attention kernel (whose FLOPs equal the fused kernels' formulas);
    gradients and RNG are left as they were. `lengths[i]` is row i's length, `row_batch(i)` its
    collated one-row batch. Runs before the timer and before a backend wraps the model."""
    by_length: dict[int, int] = {}
    for i, length in enumerate(lengths):
        by_length.setdefault(length, i)
    ordered = sorted(by_length)
    candidates = dict.fromkeys([ordered[0], ordered[-1], ordered[len(ordered) // 2], *ordered])  # spread first
    per_row: dict[int, float] = {}
    training = model.training
    model.eval()  # dropout costs no counted FLOPs; eval mode draws no random numbers
    # the math attention kernel: FlopCounterMode has no formula for CPU's fused one, which eval picks
    rng_devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=rng_devices), sdpa_kernel(SDPBackend.MATH):
        for length in candidates:
            batch = row_batch(by_length[length])
            padded = batch["input_ids"].shape[1]
            if padded in per_row:
                continue
            per_row[padded] = count_flops(functools.partial(step, batch))
            if len(per_row) == 3:
                break
    model.zero_grad(set_to_none=True)
    model.train(training)
    return FlopModel(per_row)


@dataclass(frozen=True)
class ModelSize:
    """What a model costs whatever it runs on: its parameters, all and outside the embedding tables
    (transformers' num_parameters, which leaves out every nn.Embedding: word, position, token type),
    and the FLOPs of one forward of one sequence of `length` tokens (None: not countable, see
    model_size)."""

    params: int
    params_non_embedding: int
    forward_flops: float | None
    length: int

    def figures(self) -> dict[str, float]:
        flops = {names.MODEL_FORWARD_FLOPS: self.forward_flops} if self.forward_flops is not None else {}
        return {names.MODEL_PARAMS: float(self.params),
                names.MODEL_PARAMS_NON_EMBEDDING: float(self.params_non_embedding), **flops}


def model_size(model_class: type, config: object, length: int) -> ModelSize:
    """The size of a `model_class` of `config`, built on the meta device (shapes, no weights, no
    arithmetic: instant whatever the model), its forward counted by FlopCounterMode at `length`
    tokens with the math attention kernel; no attention mask: a full row has no padding. A model
    whose forward reads a tensor's values (DeBERTa's relative positions) cannot run there: its
    FLOPs are None, never estimated."""
    with torch.device("meta"):
        model = model_class.from_config(copy.deepcopy(config)).eval()  # from_config may set fields
    ids = torch.zeros(1, length, dtype=torch.long, device="meta")
    try:
        with sdpa_kernel(SDPBackend.MATH), torch.no_grad():
            flops = count_flops(functools.partial(model, input_ids=ids))
    except (RuntimeError, NotImplementedError):  # "Tensor.item() cannot be called on meta tensors"
        flops = None
    return ModelSize(model.num_parameters(), model.num_parameters(exclude_embeddings=True), flops, length)
