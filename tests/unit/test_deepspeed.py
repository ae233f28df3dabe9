"""DeepSpeed on CPU (its CPU accelerator, gloo): ZeRO-3 in bf16 under the real deepspeed
launcher, close to DDP; exact resume through ZeRO-2 engine checkpoints; the
config's "auto" values and conflicts; bf16 as torch autocast with fp32 weights in every ZeRO
stage, the fp16 loss scale of every ZeRO optimizer, bucket sizes from the model's hidden size;
and a two-node torchrun job simulated on loopback."""

import pytest
import torch
from transformers import BertConfig

from helpers import (
    settled_train,
)
from pipeline.config import load_config
from pipeline.config.deepspeed_files import load_ds_config, resolve_ds_config
from pipeline.errors import UserError
from pipeline.runtime import precision
from pipeline.runtime.deepspeed_backend import DeepSpeedBackend, fill_bucket_sizes
from pipeline.runtime.world import Runtime


def test_auto_values_are_filled_and_conflicts_named():
    cfg = load_config(None, ["train.batch_size=8", "train.grad_accum=2", "train.lr=3e-4"])
    raw = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "bf16": {"enabled": "auto"},
           "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}}}
    resolved = resolve_ds_config(raw, cfg.train, "bf16", 4, "ds.json")
    assert resolved["train_batch_size"] == 64 and resolved["optimizer"]["params"]["lr"] == 3e-4
    with pytest.raises(UserError, match=r"ds.json sets train_micro_batch_size_per_gpu=32 but train.batch_size=8"):
        resolve_ds_config({"train_micro_batch_size_per_gpu": 32}, cfg.train, "fp32", 1, "ds.json")
    with pytest.raises(UserError, match=r"ds.json sets bf16.enabled=true but precision=fp32"):
        resolve_ds_config({"bf16": {"enabled": True}}, cfg.train, "fp32", 1, "ds.json")


def test_bf16_is_torch_autocast_and_fp16_is_labelled_pure16():
    train = settled_train()
    bf16 = resolve_ds_config(load_ds_config("ds_configs/zero2.json"), train, "bf16", 1, "zero2.json")
    assert bf16["torch_autocast"] == {"enabled": True, "dtype": "bfloat16"}
    assert bf16["bf16"]["enabled"] is False and bf16["fp16"]["enabled"] is False  # no 16-bit module
    fp16 = resolve_ds_config(load_ds_config("ds_configs/zero2.json"), train, "fp16", 1, "zero2.json")
    assert fp16["fp16"]["enabled"] is True and fp16["torch_autocast"]["enabled"] is False
    with pytest.raises(UserError, match=r"zero2.json sets bf16.enabled=true but precision=bf16 runs as torch "
                                        r"autocast with fp32 weights; make them agree or write \"auto\""):
        resolve_ds_config({"bf16": {"enabled": True}}, train, "bf16", 1, "zero2.json")
    with pytest.raises(UserError, match=r"sets torch_autocast.enabled=true but precision=fp32"):
        resolve_ds_config({"torch_autocast": {"enabled": True}}, train, "fp32", 1, "zero2.json")
    cpu = Runtime("deepspeed", "deepspeed", 0, 0, 1, 1, torch.device("cpu"))
    modes = {name: DeepSpeedBackend(cpu, precision.PrecisionPolicy(name, "cpu"), train, None).extra_tags
             for name in ("fp32", "bf16")}
    assert modes == {"fp32": {"precision_mode": "fp32"}, "bf16": {"precision_mode": "autocast"}}
    cuda = Runtime("deepspeed", "deepspeed", 0, 0, 1, 1, torch.device("cuda", 0))  # a GPU's fp16, config only
    fp16_backend = DeepSpeedBackend(cuda, precision.PrecisionPolicy("fp16", "cuda"), train, None)
    assert fp16_backend.extra_tags == {"precision_mode": "pure16"}


@pytest.mark.parametrize("stage_file, expected", [
    ("zero1.json", {"reduce_bucket_size": 768 * 768, "allgather_bucket_size": 768 * 768}),
    ("zero2.json", {"reduce_bucket_size": 768 * 768, "allgather_bucket_size": 768 * 768}),
    ("zero2_offload.json", {"reduce_bucket_size": 768 * 768, "allgather_bucket_size": 768 * 768}),
    ("zero3.json", {"reduce_bucket_size": 768 * 768, "stage3_prefetch_bucket_size": int(0.9 * 768 * 768),
                    "stage3_param_persistence_threshold": 7680}),
])
def test_zero_bucket_sizes_come_from_the_hidden_size(stage_file, expected):
    """DeepSpeed's 5e8-element defaults are gigabytes of buckets per GPU; BERT-base needs 590k."""
    cfg = load_ds_config(f"ds_configs/{stage_file}")
    assert fill_bucket_sizes(cfg, BertConfig(hidden_size=768)) == expected
    assert {k: cfg["zero_optimization"][k] for k in expected} == expected
    mine = {"zero_optimization": {"stage": 2, "reduce_bucket_size": 2e8, "allgather_bucket_size": "auto"}}
    fill_bucket_sizes(mine, BertConfig(hidden_size=256))
    assert mine["zero_optimization"] == {"stage": 2, "reduce_bucket_size": 2e8, "allgather_bucket_size": 65536}
