"""Throughput, time and energy are measured over the training steps only, whatever the
checkpoint cadence: a mid-epoch save pauses the meters, which then go on counting."""
import time

import pytest
import torch

from pipeline import names
from pipeline.measure.energy import EnergyMeter
from pipeline.measure.telemetry import StageMeters
from pipeline.runtime import collectives

CPU = torch.device("cpu")


class StandInNvml:
    """NVML's total-energy counter (mJ) for a test: this machine has no NVIDIA GPU, so the
    counter the meter reads on a GPU is stood in for by a number the test sets."""

    def __init__(self):
        self.mj = 1000.0

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        return self.mj

    def nvmlDeviceGetUtilizationRates(self, handle):
        raise RuntimeError("not sampled in this test")


def metered_energy(nvml, compiled=False):
    meter = EnergyMeter(CPU, compiled)  # unavailable on a CPU: give it the stand-in counter
    meter.available, meter.uuid, meter._handle, meter._nvml = True, "GPU-standin", "handle", nvml
    return meter


def test_a_mid_epoch_pause_leaves_out_its_time_and_energy_and_keeps_the_rest():
    nvml = StandInNvml()
    meters = StageMeters(CPU, "fp32", world_size=1)
    meters.energy = metered_energy(nvml)
    meters.start_epoch()
    meters.add_batch([31] * 32, 32, 40)
    time.sleep(0.2)
    nvml.mj += 2000  # 2 J of training
    meters.pause()  # a checkpoint save: 0.4 s and 7 J that are not training
    time.sleep(0.4)
    nvml.mj += 7000
    meters.resume()
    meters.add_batch([31] * 32, 32, 40)
    time.sleep(0.2)
    nvml.mj += 1000  # 1 J more of training
    figures = meters.end_epoch()

    assert 0.4 <= figures[names.EPOCH_TIME] < 0.6  # both training stretches, not the save
    assert meters.totals.train_seconds == figures[names.EPOCH_TIME]
    assert figures[names.SAMPLES_PER_S] == pytest.approx(64 / figures[names.EPOCH_TIME])
    assert figures[names.ENERGY_JOULES] == pytest.approx(3.0)
    assert figures[names.AVG_POWER] == pytest.approx(3.0 / figures[names.EPOCH_TIME])


def test_energy_drawn_while_compiling_is_left_out_as_its_seconds_are(monkeypatch):
    """The energy counter is NVML's stood in for (StandInNvml: no GPU here); the compilations are
    Dynamo's own start/end callbacks, fired as Dynamo fires them around a traced frame, a lazily
    compiled backward and a CUDA graph recording (which runs the step: it stays in)."""
    from torch._dynamo.callback import CallbackTrigger, callback_handler

    from pipeline.runtime import compiler

    clock = iter([0.0, 0.5])  # Dynamo's compile seconds at the segment's start and end
    monkeypatch.setattr(compiler, "compile_seconds", lambda: next(clock))
    nvml = StandInNvml()
    meters = StageMeters(CPU, "fp32", world_size=1, compiled=True)
    meters.energy = metered_energy(nvml, compiled=True)
    meters.start_epoch()
    meters.add_batch([31] * 32, 32, 40)
    nvml.mj += 1000  # 1 J of training
    for trigger, mj in ((CallbackTrigger.DYNAMO, 30000), (CallbackTrigger.LAZY_BACKWARD, 9000),
                        (CallbackTrigger.CUDAGRAPH_RECORDING, 500)):
        with callback_handler.install_callbacks(trigger, "0/0"):
            nvml.mj += mj
    nvml.mj += 1500  # 1.5 J more of training
    time.sleep(0.6)
    figures = meters.end_epoch()
    assert figures[names.ENERGY_JOULES] == pytest.approx(3.0)  # 1 + 0.5 (the recording) + 1.5
    assert meters.energy.compile_joules == pytest.approx(39.0) and figures[names.COMPILE_TIME] == pytest.approx(0.5)
    assert figures[names.AVG_POWER] == pytest.approx(3.0 / figures[names.EPOCH_TIME])
    assert not callback_handler.start_callbacks and not callback_handler.end_callbacks  # removed at the epoch's end


def test_mfu_peak_is_the_most_specific_device_entry():
    from pipeline.measure.telemetry import peak_tflops

    assert peak_tflops("NVIDIA H200", "bf16") == 989.4
    assert peak_tflops("NVIDIA H200 NVL", "bf16") == 835.5  # not the SXM part's peak
    assert peak_tflops("NVIDIA H100 NVL", "fp32") == 60.0
    assert peak_tflops("NVIDIA H100 80GB HBM3", "tf32") == 494.7
    assert peak_tflops("Tesla V100-SXM2-16GB", "fp16") is None  # not in the table: no MFU, never a guess
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16", sm_count=132) == 989.4  # the whole GPU
    # a MIG 1g.10gb slice: the whole GPU's name, 16 of its 132 SMs (what CUDA reports on the slice)
    assert peak_tflops("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "bf16", sm_count=16) == pytest.approx(989.4 * 16 / 132)


def bert_training_flops(rows: int, length: int, hidden: int, layers: int, labels: int) -> int:
    """The known count for a BERT classifier (intermediate size 4h): forward per token per layer
    24 h^2 (QKV, output, feed-forward) + 4 L h (scores and weighted sum), the pooler 2 h^2 and the
    head 2 h C per row; training (forward + backward) three times the forward."""
    per_row = layers * (24 * hidden**2 * length + 4 * length**2 * hidden) + 2 * hidden**2 + 2 * hidden * labels
    return 3 * rows * per_row


def test_step_flops_match_the_analytic_bert_count_for_every_batch_shape():
    import transformers

    from pipeline.measure.flops import FlopModel, count_flops

    hidden, layers, labels = 64, 2, 3
    model = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=100, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
        intermediate_size=4 * hidden, num_labels=labels))

    def step(rows, length):
        ids = torch.randint(0, 100, (rows, length))
        labels = torch.zeros(rows, dtype=torch.long)
        model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels).loss.backward()

    assert count_flops(lambda: step(3, 20)) == bert_training_flops(3, 20, hidden, layers, labels)
    # three single-row counts fix the model for every other shape
    flop_model = FlopModel({n: count_flops(lambda n=n: step(1, n)) for n in (7, 31, 64)})
    for rows, length in ((5, 13), (2, 90), (16, 31)):
        expected = bert_training_flops(rows, length, hidden, layers, labels)
        assert flop_model.batch(rows, length) == pytest.approx(expected, rel=1e-9)


def two_ranks(local: collectives.Figures, same_gpu: bool) -> collectives.Figures:
    """What the epoch's collective gives two ranks of which the second did no work (sums are this
    rank's), on this rank's GPU or another one (the per-rank figure `gpu`: the GPU's key)."""
    (mine,) = local.per_rank
    other = {**mine, "gpu": mine["gpu"] if same_gpu else mine["gpu"] + 1}
    return collectives.Figures(local.sums, local.maxes, local.mins, [mine, other])


def test_mfu_counts_a_gpu_two_ranks_share_once():
    """PIPELINE_SHARE_GPU=1: two ranks on one GPU have one GPU's peak, not two."""
    from pipeline.measure.flops import FlopModel

    figures = {}
    for same_gpu in (False, True):
        meters = StageMeters(CPU, "bf16", world_size=2)
        meters.peak_tflops, meters.flop_model = 1e-12, FlopModel({n: 100.0 for n in (4, 8)})
        meters.start_epoch()
        meters.add_batch([4, 4], 2, 4)
        figures[same_gpu] = meters.epoch_figures(two_ranks(meters.epoch_local(), same_gpu))
    assert figures[True][names.MFU] / figures[True][names.TFLOPS] == pytest.approx(
        2 * figures[False][names.MFU] / figures[False][names.TFLOPS])


def test_mfu_and_tokens_count_real_tokens_with_the_padded_figures_beside():
    """A batch of three data rows of 2, 5 and 8 tokens padded to 8, plus one filler row (a compiled
    job's): useful work is each data row at its own length, the device computed 4 rows x 8."""
    from pipeline.measure.flops import FlopModel

    def f(n):  # a row's FLOPs: c0 + c1 n + c2 n^2
        return 10 + 5 * n + n * n

    meters = StageMeters(CPU, "bf16", world_size=2)
    meters.peak_tflops = 1e-12  # this CPU has no peak-table entry; 1 FLOP/s per device stands in for one
    meters.flop_model = FlopModel({n: f(n) for n in (4, 8, 16)})
    assert meters.flop_model.rows([2, 5, 8]) == pytest.approx(24 + 60 + 114)
    meters.start_epoch()
    meters.add_batch([2, 5, 8], 4, 8)
    time.sleep(0.05)
    figures = meters.epoch_figures(two_ranks(meters.epoch_local(), same_gpu=False))

    seconds = figures[names.EPOCH_TIME]
    assert figures[names.TOKENS_PER_S] == pytest.approx(15 / seconds)
    assert figures[names.PADDED_TOKENS_PER_S] == pytest.approx(32 / seconds)
    assert figures[names.FLOPS_PER_SAMPLE] == pytest.approx(198 / 3)
    assert figures[names.TFLOPS] == pytest.approx(198 / seconds / 1e12)
    assert figures[names.TFLOPS_PADDED] == pytest.approx(4 * 114 / seconds / 1e12)
    assert figures[names.MFU] == pytest.approx(198 / seconds / 2)  # two devices' peak
    assert figures[names.MFU_PADDED] == pytest.approx(456 / seconds / 2)
    final = meters.final_figures(None)
    assert final[names.MFU] / final[names.MFU_PADDED] == pytest.approx(198 / 456)
    assert final[names.TOKENS_PER_S] / final[names.PADDED_TOKENS_PER_S] == pytest.approx(15 / 32)
