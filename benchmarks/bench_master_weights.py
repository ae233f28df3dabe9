"""Memory of precision=bf16-pure against autocast bf16, counted tensor by tensor after one real step
of the pipeline's TorchBackend: the module's weights, the optimizer's fp32 masters and moments, the
gradients, and what the forward saves for backward (torch.autograd.graph.saved_tensors_hooks, each
storage once; a saved parameter is not counted, a saved cast of one is). Counts, not timings, so any
CPU gives the same figures; the policy is built directly because an AVX2 CPU is refused bf16 by
precision.resolve (bf16 arithmetic still runs there, slowly). Speed needs AVX512-BF16 or a GPU.

    python benchmarks/bench_master_weights.py                 # BanglaBERT sizes, batch 4 x 128
    python benchmarks/bench_master_weights.py --quick         # a tiny model (smoke run)
"""
from __future__ import annotations

import torch
import transformers

from common import parser, save

MB = 2**20


def nbytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def measure(precision_name: str, config: transformers.BertConfig, batch: int, length: int) -> dict:
    from pipeline.runtime.precision import PrecisionPolicy
    from pipeline.runtime.torch_backend import TorchBackend
    from pipeline.runtime.world import Runtime

    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    policy = PrecisionPolicy(precision_name, "cpu")
    backend = TorchBackend(Runtime("none", "single", 0, 0, 1, 1, torch.device("cpu")), policy, max_grad_norm=1.0)
    backend.prepare(model, optimizer)
    params = list(model.parameters())
    param_storages = {p.untyped_storage().data_ptr() for p in params}
    saved = []

    def pack(t):
        if t.untyped_storage().data_ptr() not in param_storages:
            saved.append(t)
        return t

    ids = torch.randint(5, config.vocab_size, (batch, length))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), policy.autocast():
        loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=torch.zeros(batch, dtype=torch.long)
                     ).loss
    saved_mb = nbytes(saved) / MB
    backend.backward(loss)
    module_grads = nbytes(p.grad for p in params)
    if backend.masters is not None:
        backend.masters.grads_to_master()  # the step's fp32 gradients, held beside the bf16 ones
    step_grads = module_grads + (nbytes(m.grad for m in backend.masters.master) if backend.masters else 0)
    backend.step()
    masters = nbytes(backend.masters.master) / MB if backend.masters else 0.0
    moments = nbytes(t for s in optimizer.state.values() for k, t in s.items() if k != "step") / MB
    weights = nbytes(params) / MB
    return {"precision": precision_name, "parameters (M)": sum(p.numel() for p in params) / 1e6,
            "module weights MB": weights, "fp32 masters MB": masters, "moments MB": moments,
            "gradients at the step MB": step_grads / MB, "saved for backward MB": saved_mb,
            "total MB": weights + masters + moments + step_grads / MB + saved_mb}


def main():
    p = parser(__doc__, batch_size=4, max_length=128)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    sizes = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                 vocab_size=32000)  # BanglaBERT's sizes (ELECTRA-base discriminator, 110M parameters)
    if args.quick:
        sizes = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256, vocab_size=500)
        args.batch_size, args.max_length = 2, 16
    config = transformers.BertConfig(**sizes, num_labels=3, max_position_embeddings=512)
    rows = [measure(name, config, args.batch_size, args.max_length) for name in ("bf16", "bf16-pure")]
    name = "master-weights-quick" if args.quick else f"master-weights-{args.batch_size}x{args.max_length}"
    save(name, rows, list(rows[0]), vars(args))


if __name__ == "__main__":
    main()
