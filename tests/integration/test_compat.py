"""pipeline/compat.py on whichever torch and transformers are installed: `make test` runs it on the newest
tested, `make test-floor` on the floors (pyproject.toml). Each test holds on both; what differs is which
branch answers."""
import time

import pytest
import torch
from transformers import BertConfig

from helpers import ddp_syncs_buffers_every_forward, free_port, tracking_db
from pipeline import compat, models
from pipeline.tasks import get_task


def tiny_classifier():
    config = BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, **get_task("sentiment").model_kwargs())
    torch.manual_seed(0)
    return get_task("sentiment").model_class.from_config(config, dtype=torch.float32)


@pytest.mark.slow  # a gloo group and transformers' first model: ~3 s in a fresh process
def test_ddp_is_built_without_a_buffer_sync_before_each_forward_on_this_torch():
    """The keyword differs across torch versions (a TypeError on the wrong one): construction and a step
    run, and the wrapper says it will not broadcast buffers before a forward."""
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        ddp = compat.ddp_without_forward_buffer_sync(tiny_classifier(), None)
        assert not ddp_syncs_buffers_every_forward(ddp)
        out = ddp(input_ids=torch.randint(5, 100, (2, 8)), labels=torch.tensor([0, 1]))
        out.loss.backward()
        assert all(p.grad is not None for p in ddp.module.parameters() if p.requires_grad)
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow  # transformers' first model in a fresh process
def test_checkpointing_runs_a_layers_module_hooks_as_many_times_as_compat_says():
    """A forward pre-hook on an encoder layer (where ZeRO-3 gathers the layer's parameters): once per step
    where transformers checkpoints the layer's forward, twice where it checkpoints its __call__ (the
    recompute runs it again)."""
    model = tiny_classifier()
    models.checkpoint_activations(model, "preset:test")
    calls = []
    model.bert.encoder.layer[0].register_forward_pre_hook(lambda *_: calls.append(1))
    model.train()
    out = model(input_ids=torch.randint(5, 100, (2, 8)), labels=torch.tensor([0, 1]))
    out.loss.backward()
    assert len(calls) == (2 if compat.checkpoint_reruns_module_hooks() else 1)
    assert model.bert.encoder.layer[0].gradient_checkpointing


@pytest.mark.slow  # an MLflow store and a sampler thread
def test_the_system_metrics_sampler_logs_a_nodes_metrics_into_a_run_opened_by_a_client(tmp_path):
    """The class compat reaches into (not exported by mlflow.system_metrics) still takes these keywords
    and logs system/NODE/ metrics into the run, leaving the run's status to its owner."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tracking_db(tmp_path)}"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("e")).info.run_id
    monitor = compat.system_metrics_monitor(run_id, 0.2, "node0-host", uri)
    monitor.start()
    time.sleep(1.0)
    monitor.finish()
    run = client.get_run(run_id)
    assert any(k.startswith("system/node0-host/cpu_utilization") for k in run.data.metrics), run.data.metrics
    assert run.info.status == "RUNNING"
