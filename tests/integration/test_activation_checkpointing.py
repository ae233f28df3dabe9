"""train.gradient_checkpointing recomputes each encoder layer in the backward pass and changes no
number: with dropout on, the same losses and gradients bit for bit on CPU in fp32 (the DDP parity
test in test_ddp.py runs its two ranks with it on against one process without)."""
import copy

import pytest
import torch
from transformers import BertConfig

from pipeline import models
from pipeline.tasks import get_task


def tiny_classifier():
    task = get_task("sentiment")
    config = BertConfig(vocab_size=300, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                        **task.model_kwargs())
    torch.manual_seed(0)
    return task.model_class.from_config(config, dtype=torch.float32)


def train_steps(model, steps=3, count_calls=True):
    """Losses and final gradients of a few AdamW steps with dropout on; counts the first layer's
    attention forwards (inside the checkpointed region, so a recompute counts twice)."""
    calls = []
    if count_calls:  # a hook's side effect inside the checkpoint would break a compiled graph
        model.bert.encoder.layer[0].attention.register_forward_hook(lambda *_: calls.append(1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(1)
    torch.manual_seed(2)  # dropout's stream
    model.train()
    losses = []
    for _ in range(steps):
        ids = torch.randint(5, 300, (4, 24), generator=data)
        mask = torch.ones_like(ids)
        mask[0, 20:] = 0
        out = model(input_ids=ids, attention_mask=mask, labels=torch.randint(0, 2, (4,), generator=data))
        out.loss.backward()
        losses.append(out.loss.detach().clone())
        optimizer.step()
        if len(losses) < steps:
            optimizer.zero_grad()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return losses, grads, len(calls)


@pytest.mark.slow  # ~3 s in a fresh process: transformers' first model (0.1 s once warm)
def test_checkpointing_recomputes_layers_and_gives_bitwise_the_same_losses_with_dropout():
    plain = tiny_classifier()
    checkpointed = copy.deepcopy(plain)
    models.checkpoint_activations(checkpointed, "preset:test")
    plain_losses, plain_grads, plain_calls = train_steps(plain)
    ckpt_losses, ckpt_grads, ckpt_calls = train_steps(checkpointed)
    assert ckpt_calls == 2 * plain_calls == 6  # forward, then the recompute in backward
    assert all(torch.equal(a, b) for a, b in zip(plain_losses, ckpt_losses))
    assert plain_grads.keys() == ckpt_grads.keys()
    assert all(torch.equal(plain_grads[n], ckpt_grads[n]) for n in plain_grads)
    # dropout was on (two draws differ), so the equality above needed the RNG restored for the recompute
    assert not torch.equal(plain(input_ids=torch.ones(2, 8, dtype=torch.long)).logits,
                           plain(input_ids=torch.ones(2, 8, dtype=torch.long)).logits)


@pytest.mark.slow
def test_a_compiled_checkpointed_model_traces_whole_and_matches_eager():
    """Dynamo traces torch.utils.checkpoint as one higher-order op: no graph break (transformers'
    use_cache warning would be one per layer), the same losses as eager without checkpointing.
    aot_eager: Dynamo's and AOTAutograd's graphs without inductor's minutes of CPU code generation."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    plain = tiny_classifier()
    checkpointed = copy.deepcopy(plain)
    models.checkpoint_activations(checkpointed, "preset:test")
    checkpointed.compile(backend="aot_eager", dynamic=False)
    plain_losses, _, _ = train_steps(plain, count_calls=False)
    compiled_losses, _, _ = train_steps(checkpointed, count_calls=False)
    assert not torch._dynamo.utils.counters["graph_break"]
    assert all(torch.equal(a, b) for a, b in zip(plain_losses, compiled_losses))
