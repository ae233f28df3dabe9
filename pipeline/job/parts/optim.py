"""The optimizer and learning-rate schedule of a stage: AdamW with the BERT weight-decay
recipe and linear warm-up then decay (the Hugging Face default)."""
from __future__ import annotations

import math

import torch
import transformers

from pipeline.config import TrainConfig


def build_optimizer(model: torch.nn.Module, train: TrainConfig, total_steps: int,
                    fused: bool) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """(AdamW, its linear warm-up/decay schedule over total_steps optimizer steps).

    fused: one kernel pass over all parameters (CPU and CUDA), the HF Trainer's default; the
    backend says whether it wants it (Backend.fused_optimizer)."""
    optimizer = torch.optim.AdamW(param_groups(model, train.weight_decay), lr=train.lr, fused=fused)
    return optimizer, lr_schedule(optimizer, train, total_steps)


def lr_schedule(optimizer: torch.optim.Optimizer, train: TrainConfig, total_steps: int
                ) -> torch.optim.lr_scheduler.LambdaLR:
    """The linear warm-up/decay schedule over total_steps optimizer steps, setting the lr of
    `optimizer`'s parameter groups: it must be the optimizer that steps (Backend.optimizer)."""
    return transformers.get_linear_schedule_with_warmup(
        optimizer, num_warmup_steps=math.ceil(train.warmup_ratio * total_steps), num_training_steps=total_steps)


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """No weight decay on biases and LayerNorm weights (the BERT recipe)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 or "LayerNorm" in name or "layer_norm" in name else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]

