"""AMP semantics users rely on: loss scaling skips overflowing steps without advancing the
schedule, master weights and optimizer state stay fp32, `auto` and refusals per device; a mode is
one declaration that every part of the pipeline asks."""
import math

import pytest
import torch
import transformers

from helpers import settled_train
from pipeline.config import load_config, precision_modes
from pipeline.config.deepspeed_files import load_ds_config
from pipeline.config.precision_modes import PrecisionMode
from pipeline.errors import UserError
from pipeline.job.parts.step_losses import rewind
from pipeline.measure import inference
from pipeline.report import amp_step
from pipeline.runtime import precision
from pipeline.runtime.deepspeed_backend import DeepSpeedBackend
from pipeline.runtime.torch_backend import TorchBackend
from pipeline.runtime.world import Runtime

CPU = Runtime("none", "single", 0, 0, 1, 1, torch.device("cpu"))


def tiny_setup(policy_name, lr=1e-2):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, fused=True)  # the torch backend's: it skips on the device
    sched = transformers.get_linear_schedule_with_warmup(opt, num_warmup_steps=2, num_training_steps=10)
    backend = TorchBackend(CPU, precision.PrecisionPolicy(policy_name, "cpu"), max_grad_norm=1.0)
    backend.prepare(model, opt)
    return backend, opt, sched


def train_step(backend, sched, scale_loss=1.0):
    x = torch.randn(4, 8)
    with backend.policy.autocast():
        loss = backend.model(x).float().pow(2).mean() * scale_loss
    backend.backward(loss)
    result = backend.step()
    if result.stepped:
        sched.step()
    return result


def test_fp16_overflow_skips_step_halves_scale_and_freezes_schedule():
    backend, opt, sched = tiny_setup("fp16")
    train_step(backend, sched)
    scale = backend.loss_scale
    lr_before, epoch_before = sched.get_last_lr()[0], sched.last_epoch
    weights_before = [p.detach().clone() for p in backend.module.parameters()]

    result = train_step(backend, sched, scale_loss=math.inf)  # forced overflow

    assert not result.stepped
    assert backend.loss_scale == scale / 2
    assert sched.last_epoch == epoch_before and sched.get_last_lr()[0] == lr_before
    for before, after in zip(weights_before, backend.module.parameters()):
        assert torch.equal(before, after)
    assert all(p.grad is None for p in backend.module.parameters())  # nothing leaks into the next step

    result = train_step(backend, sched)  # training continues at the halved scale
    assert result.stepped and sched.last_epoch == epoch_before + 1


def test_nonfinite_gradient_is_skipped_without_scaler():
    backend, opt, sched = tiny_setup("fp32")
    train_step(backend, sched)
    before = [p.detach().clone() for p in backend.module.parameters()]
    result = train_step(backend, sched, scale_loss=math.nan)
    assert not result.stepped
    assert all(torch.equal(b, a) for b, a in zip(before, backend.module.parameters()))


def test_a_skipped_step_given_back_leaves_the_schedule_where_it_would_be():
    """The loop steps the schedule on every step and reads the skip flags later (no host sync per
    step): giving the skipped steps back must land on the LR of the steps really taken."""
    _, opt, sched = tiny_setup("fp32")
    _, ref_opt, ref_sched = tiny_setup("fp32")
    for _ in range(5):
        sched.step()
    for _ in range(3):
        ref_sched.step()
    rewind(sched, 2)
    assert sched.last_epoch == ref_sched.last_epoch == 3
    assert sched.get_last_lr() == ref_sched.get_last_lr()
    assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in ref_opt.param_groups]
    sched.step(), ref_sched.step()
    assert sched.get_last_lr() == ref_sched.get_last_lr()


def test_the_skip_decision_stays_on_the_device():
    backend, opt, sched = tiny_setup("fp32")
    result = train_step(backend, sched, scale_loss=math.nan)
    assert isinstance(result.stepped, torch.Tensor) and not result.stepped  # read only when asked
    assert all(state["step"].item() == 0 for state in opt.state.values())  # fused AdamW undid its count


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_master_weights_and_optimizer_state_stay_fp32(name):
    backend, opt, sched = tiny_setup(name)
    with backend.policy.autocast():
        out = backend.model(torch.randn(4, 8))
    assert out.dtype == backend.policy.compute_dtype  # the matmuls really ran in 16 bit
    for _ in range(3):
        assert train_step(backend, sched).stepped
    assert all(p.dtype == torch.float32 for p in backend.module.parameters())
    for state in opt.state.values():
        assert state["exp_avg"].dtype == torch.float32 and state["exp_avg_sq"].dtype == torch.float32


def test_clipping_sees_unscaled_gradients():
    backend, opt, sched = tiny_setup("fp16")
    ref, _, ref_sched = tiny_setup("fp32")
    torch.manual_seed(1)
    r16 = train_step(backend, sched)
    torch.manual_seed(1)
    r32 = train_step(ref, ref_sched)
    # the scale is 65536: a norm of the scaled gradients would be off by that factor
    assert float(r16.grad_norm) == pytest.approx(float(r32.grad_norm), rel=2e-2)


def test_policy_resolution_on_cpu(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(precision, "cpu_supports_bf16", lambda: True)
    assert precision.resolve("auto", cpu).name == "bf16"
    monkeypatch.setattr(precision, "cpu_supports_bf16", lambda: False)
    monkeypatch.delenv(precision.EMULATED_BF16_ENV)  # the suite's override off: an AVX2-only CPU as a user has it
    assert precision.resolve("auto", cpu).name == "fp32"
    with pytest.raises(UserError, match="precision=bf16: this cpu device has no bf16 support") as refused:
        precision.resolve("bf16", cpu)
    assert f"set {precision.EMULATED_BF16_ENV}=1" in str(refused.value)  # the one line names the override
    monkeypatch.setenv(precision.EMULATED_BF16_ENV, "1")
    assert precision.resolve("bf16", cpu).name == "bf16"  # emulated, as asked
    assert precision.resolve("auto", cpu).name == "fp32"  # auto picks bf16 only where it is native (faster)
    monkeypatch.setattr(precision, "cpu_supports_fp16", lambda: False)
    with pytest.raises(UserError, match="precision=fp16: this CPU has no fp16 kernels"):
        precision.resolve("fp16", cpu)


def test_fp32_is_strict_and_tf32_allows_tensor_cores():
    cpu = torch.device("cpu")
    tf32 = precision.resolve("tf32", cpu)
    assert torch.get_float32_matmul_precision() == "highest"  # resolving a policy changes nothing
    tf32.apply_matmul_mode()
    assert torch.get_float32_matmul_precision() == "high" and torch.backends.cudnn.allow_tf32
    precision.resolve("fp32", cpu).apply_matmul_mode()
    assert torch.get_float32_matmul_precision() == "highest" and not torch.backends.cudnn.allow_tf32


def test_gpus_that_only_emulate_bf16_get_fp16(monkeypatch):
    """A stand-in for an absent V100/T4: torch.cuda.is_bf16_supported says True when emulation
    counts (its default) and False for native bf16 only. auto must pick fp16, bf16 be refused."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    cuda = torch.device("cuda", 0)
    assert precision.resolve("auto", cuda).name == "fp16"
    with pytest.raises(UserError, match="precision=bf16: this cuda device has no bf16 support"):
        precision.resolve("bf16", cuda)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)  # an A100/H100
    assert precision.resolve("auto", cuda).name == "bf16"


def separate_clip_step(model, opt, scaler, max_norm):
    """The reference: unscale, clip_grad_norm_'s own multiply pass, then the fused step."""
    params = [p for p in model.parameters() if p.grad is not None]
    if scaler:
        scaler.unscale_(opt)
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    if scaler:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()
    opt.zero_grad(set_to_none=True)
    return norm


@pytest.mark.parametrize("name", ["fp32", "fp16"])
def test_clipping_inside_the_fused_step_matches_a_separate_clipping_pass(name):
    backend, opt, sched = tiny_setup(name)
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, fused=True)
    ref_sched = transformers.get_linear_schedule_with_warmup(ref_opt, num_warmup_steps=2, num_training_steps=10)
    ref_scaler = backend.policy.make_scaler()
    compared = 0
    for step in range(12):
        torch.manual_seed(step)
        result = train_step(backend, sched, scale_loss=100.0)  # gradients far above max_grad_norm=1
        torch.manual_seed(step)
        x = torch.randn(4, 8)
        with backend.policy.autocast():
            loss = ref(x).float().pow(2).mean() * 100.0
        (ref_scaler.scale(loss) if ref_scaler else loss).backward()
        ref_norm = separate_clip_step(ref, ref_opt, ref_scaler, 1.0)
        if not math.isfinite(ref_norm):  # fp16's first scale overflows: both skip the step
            assert not result.stepped and not math.isfinite(result.grad_norm)
            continue
        assert float(ref_norm) > 10  # clipping really acts
        assert float(result.grad_norm) == pytest.approx(float(ref_norm), rel=1e-5)
        ref_sched.step()
        compared += 1
    assert compared >= 3
    for mine, theirs in zip(backend.module.parameters(), ref.parameters()):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)  # fp32 rounding apart
    assert all(not hasattr(opt, attr) for attr in ("grad_scale", "found_inf"))  # nothing left for the next step


def test_a_mode_added_to_the_registry_alone_is_run_served_and_reported_as_it_declares(monkeypatch):
    """A throwaway mode (bf16 autocast with loss scaling, DeepSpeed's bf16 module, on the report's
    fp32 side, so no field matches a real mode's by accident), with no file but the registry edited."""
    mode = PrecisionMode("bf16-scaled", "bfloat16", "bf16", served_as="bf16", autocast=True, loss_scaling=True,
                         deepspeed={"fp16": {"enabled": False}, "bf16": {"enabled": True},
                                    "torch_autocast": {"enabled": False}}, report=precision_modes.REFERENCE)
    monkeypatch.setitem(precision_modes.MODES, mode.name, mode)
    monkeypatch.setenv(precision.EMULATED_BF16_ENV, "1")  # its bf16 passes the device check on any CPU
    assert load_config(None, [f"precision={mode.name}"]).precision == mode.name

    policy = precision.resolve(mode.name, torch.device("cpu"))
    assert policy.spec is mode and policy.mode == precision_modes.AUTOCAST and policy.module_dtype == torch.float32
    with policy.autocast():
        assert torch.nn.Linear(4, 4)(torch.randn(2, 4)).dtype == torch.bfloat16
    assert isinstance(policy.make_scaler(), torch.amp.GradScaler)

    ds = DeepSpeedBackend(CPU, policy, settled_train(), None)  # the shipped zero2.json: its blocks say "auto"
    assert load_ds_config(None)["bf16"]["enabled"] == "auto"
    assert ds.ds_config["bf16"]["enabled"] is True and ds.ds_config["fp16"]["enabled"] is False
    assert ds.extra_tags == {"precision_mode": precision_modes.PURE16}  # DeepSpeed's bf16 block: a 16-bit module

    assert inference.inference_precisions(mode.name, torch.device("cpu"))[0] == "bf16"
    assert precision_modes.report_side(mode.name) == "fp32"
    assert amp_step._autocast_dtype(mode.name) == "bfloat16"
