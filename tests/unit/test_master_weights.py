"""precision=bf16-pure: the module holds bf16 weights, the fp32 master weights and AdamW's moments
live only in the optimizer; checkpoints and best/ keep the fp32 masters, so a resume in any mode is
exact. This CPU (AVX2, no AVX512-BF16) is refused bf16 by the pipeline, but bf16 arithmetic runs
here (slowly): these tests build the policy directly to test the mechanics on small models."""
import pytest
import torch
import transformers

from pipeline.errors import UserError
from pipeline.runtime import precision
from pipeline.runtime.torch_backend import TorchBackend
from pipeline.runtime.world import Runtime

CPU = Runtime("none", "single", 0, 0, 1, 1, torch.device("cpu"))
PURE = precision.PrecisionPolicy("bf16-pure", "cpu")


def setup(policy=PURE, lr=1e-2, max_grad_norm=1.0):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, fused=True)
    backend = TorchBackend(CPU, policy, max_grad_norm=max_grad_norm)
    backend.prepare(model, opt)
    return backend, opt


def step(backend, seed, scale=1.0):
    torch.manual_seed(seed)
    x = torch.randn(4, 8)
    with backend.policy.autocast():
        loss = backend.model(x.to(backend.policy.module_dtype)).float().pow(2).mean() * scale
    backend.backward(loss)
    return backend.step()


def masters(opt):
    return [p for group in opt.param_groups for p in group["params"]]


def test_the_module_holds_bf16_and_the_optimizer_fp32_masters_and_moments():
    backend, opt = setup()
    assert all(p.dtype == torch.bfloat16 for p in backend.module.parameters())
    assert all(m.dtype == torch.float32 for m in masters(opt))
    module_ids = {id(p) for p in backend.module.parameters()}
    assert not any(id(m) in module_ids for m in masters(opt))  # the optimizer steps its own copies
    assert not backend.policy.uses_autocast and backend.extra_tags["precision_mode"] == "pure16"
    for seed in range(3):
        assert step(backend, seed).stepped
    for state in opt.state.values():
        assert state["exp_avg"].dtype == torch.float32 and state["exp_avg_sq"].dtype == torch.float32
    assert all(p.grad is None for p in backend.module.parameters())


def test_a_step_updates_the_fp32_masters_then_copies_them_down():
    backend, opt = setup(max_grad_norm=0.1)
    ref = [m.detach().clone() for m in masters(opt)]
    torch.manual_seed(1)
    backend.model(torch.randn(4, 8).to(torch.bfloat16)).float().pow(2).mean().backward()
    # the reference: fused AdamW on fp32 copies with the bf16 gradients in fp32, clipped by clip_grad_norm_
    for p, low in zip(ref, backend.module.parameters()):
        p.grad = low.grad.float()
    norm = torch.nn.utils.clip_grad_norm_(ref, 0.1)
    assert norm > 0.1  # clipping acts
    ref_params = [torch.nn.Parameter(p) for p in ref]
    for p, r in zip(ref_params, ref):
        p.grad = r.grad
    torch.optim.AdamW(ref_params, lr=1e-2, fused=True).step()
    result = backend.step()

    assert float(result.grad_norm) == pytest.approx(float(norm), rel=1e-5)
    for mine, theirs, low in zip(masters(opt), ref_params, backend.module.parameters()):
        torch.testing.assert_close(mine, theirs.detach(), rtol=1e-5, atol=1e-6)
        assert torch.equal(low, mine.to(torch.bfloat16))  # the module: the masters rounded to bf16


def test_updates_below_bf16_resolution_accumulate_in_the_masters():
    """Why the masters exist: AdamW's first update is about lr per weight; at lr 1e-6 that is far
    below bf16's spacing at the weights' size (2^-9 near 0.3), so bf16 weights would not move at all.
    The fp32 masters take every update; the module's copies move only once they add up."""
    backend, opt = setup(lr=1e-6, max_grad_norm=0.0)
    matrices = [i for i, p in enumerate(backend.module.parameters()) if p.ndim == 2]
    low_before = [p.detach().clone() for p in backend.module.parameters()]
    master_before = [m.detach().clone() for m in masters(opt)]
    step(backend, 0)
    for i in matrices:
        moved_master = (masters(opt)[i] != master_before[i]).float().mean()
        moved_low = (list(backend.module.parameters())[i] != low_before[i]).float().mean()
        assert moved_master > 0.95 and moved_low < 0.05, (i, moved_master, moved_low)


def test_layer_norm_over_bf16_computes_its_statistics_in_fp32():
    """Why bf16-pure needs no autocast around LayerNorm: torch's kernel reads and writes bf16 but
    accumulates mean and variance in fp32, so its output is the fp32 result rounded (within bf16's
    spacing), where the same formula in bf16 arithmetic is far off (inputs far from zero)."""
    torch.manual_seed(0)
    x = (torch.randn(64, 768) * 3 + 100).to(torch.bfloat16)
    weight, bias = torch.randn(768).to(torch.bfloat16), torch.randn(768).to(torch.bfloat16)
    exact = torch.nn.functional.layer_norm(x.float(), (768,), weight.float(), bias.float())
    kernel = torch.nn.functional.layer_norm(x, (768,), weight, bias)
    mean = x.mean(-1, keepdim=True)
    by_hand = (x - mean) / torch.sqrt(((x - mean) ** 2).mean(-1, keepdim=True) + 1e-5) * weight + bias
    step = exact.abs().max() * 2**-7  # bf16's spacing at the largest outputs (8 significant bits)
    assert (kernel.float() - exact).abs().max() <= step
    assert (by_hand.float() - exact).abs().max() > 2 * step


def test_checkpoints_hold_the_fp32_masters_and_resume_exactly_in_either_mode(tmp_path):
    backend, opt = setup()
    for seed in range(3):
        step(backend, seed)
    backend.save(tmp_path, rank=0)
    saved = torch.load(tmp_path / "backend.pt", weights_only=True)
    assert all(v.dtype == torch.float32 for v in saved["model"].values())
    for (name, value), master in zip(saved["model"].items(), masters(opt)):
        assert torch.equal(value, master), name
    full = backend.full_state_dict()  # what best/ and the final test get
    assert all(torch.equal(full[k], v) for k, v in saved["model"].items())

    resumed, resumed_opt = setup()
    resumed.load(tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(masters(resumed_opt), masters(opt)))
    assert all(torch.equal(a, b) for a, b in zip(resumed.module.parameters(), backend.module.parameters()))
    step(backend, 7), step(resumed, 7)  # the same next step, bit for bit
    assert all(torch.equal(a, b) for a, b in zip(masters(resumed_opt), masters(opt)))
    assert all(torch.equal(a, b) for a, b in zip(resumed.module.parameters(), backend.module.parameters()))

    # into the autocast mode (fp32 module weights): the masters become the module's weights exactly
    autocast, autocast_opt = setup(precision.PrecisionPolicy("bf16", "cpu"))
    autocast.load(tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(autocast.module.parameters(), saved["model"].values()))
    for a, b in zip(autocast_opt.state.values(), saved["optimizer"]["state"].values()):
        assert torch.equal(a["exp_avg"], b["exp_avg"]) and torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])
    # and back: an autocast checkpoint into bf16-pure
    (tmp_path / "again").mkdir()
    autocast.save(tmp_path / "again", rank=0)
    back, back_opt = setup()
    back.load(tmp_path / "again")
    assert all(torch.equal(a, b) for a, b in zip(masters(back_opt), autocast.module.parameters()))


def test_best_model_directory_keeps_the_fp32_masters(tmp_path):
    import tokenizers
    from safetensors.torch import load_file

    from pipeline.models import save_pretrained_fp32

    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    backend = TorchBackend(CPU, PURE, max_grad_norm=1.0)
    backend.prepare(model, opt)
    ids = torch.randint(0, 50, (2, 6))
    backend.backward(backend.model(input_ids=ids, labels=torch.tensor([0, 1])).loss)
    backend.step()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")))
    save_pretrained_fp32(backend.module, backend.full_state_dict(), tokenizer, tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    by_name = dict(zip(backend.masters.names, backend.masters.master))
    assert all(v.dtype == torch.float32 for v in weights.values())
    assert all(torch.equal(weights[k], m) for k, m in by_name.items() if k in weights)
    assert any(not torch.equal(m, m.to(torch.bfloat16).float()) for m in by_name.values())  # not bf16-rounded


def test_refusals_name_the_mode(monkeypatch):
    from pipeline.runtime.deepspeed_backend import DeepSpeedBackend

    monkeypatch.setattr(precision, "cpu_supports_bf16", lambda: False)  # this CPU: AVX2 only
    monkeypatch.delenv(precision.EMULATED_BF16_ENV)  # and the suite's emulation override off
    with pytest.raises(UserError, match="precision=bf16-pure: this cpu device has no bf16 support"):
        precision.resolve("bf16-pure", torch.device("cpu"))
    monkeypatch.setattr(precision, "cpu_supports_bf16", lambda: True)
    assert precision.resolve("bf16-pure", torch.device("cpu")) == PURE
    assert precision.resolve("auto", torch.device("cpu")).name == "bf16"  # auto never picks it
    with pytest.raises(UserError, match="precision=bf16-pure with backend=deepspeed: not supported"):
        DeepSpeedBackend(Runtime("deepspeed", "deepspeed", 0, 0, 1, 1, torch.device("cpu")), PURE, None, None)
