"""The GPU step's profile (benchmarks/kernel_profile.py): which trace events count as kernel time, the
one class each kernel falls in, the busy union, and each class's floor. The trace events are hand-made
in the format torch.profiler's export_chrome_trace writes (no GPU here); the kernel names are ones
CUDA, cuBLAS, cuDNN, aten and inductor give their kernels (several from an H100 profile of the
benchmark)."""
import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from helpers import bench_module
from pipeline.measure import telemetry
from pipeline.runtime import precision

kernels = bench_module("kernel_profile")

NAMES = {
    "matmul": [
        "nvjet_sm90_tst_192x128_64x5_1x2_h_bz_coopB_bias_TNT",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel",
        "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(Params)",
        "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_tn",
        "triton_tem_fused_addmm_gelu_view_3",  # an inductor GEMM template, GELU fused in its epilogue
        "triton_poi_fused_addmm_view_2",  # addmm's bias add left apart from cuBLAS's GEMM
    ],
    "attention": [
        "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_1x4x1_cga1x1x1_kernel0_0",
        "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, "
        "cutlass::bfloat16_t>, true, false, false, false, true, true, false>(pytorch_flash::Flash_fwd_params)",
        "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t, "
        "cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)",
    ],
    "optimizer": [
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
        "FusedOptimizerTensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, "
        "(at::native::ADAM_MODE)1, false>, double, float*, float*, float*, float, bool*, bool*>",
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
        "TensorListMetadata<1>, at::native::(anonymous namespace)::LpNormFunctor<float, (at::native::"
        "(anonymous namespace)::NormType)1, float, float>, float*, int>(long, at::native::(anonymous namespace)",
    ],
    "norm+dropout+residual": [
        "triton_per_fused__to_copy_add_native_dropout_native_layer_norm_native_layer_norm_backward_view_9",
        "triton_per_fused__to_copy_add_native_dropout_backward_native_layer_norm_backward_view_18",
        "triton_poi_fused__to_copy_add_4",  # a residual add with its cast
        "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, float, "
        "float const*, float const*, float const*, float*, float*, float*)",
        "void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel_32x32<float, float>",
        "void at::native::(anonymous namespace)::fused_dropout_kernel_vec<float, float, unsigned int, 1, 4, bool>",
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
        "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)",
    ],
    "activation": [
        "triton_poi_fused_gelu_gelu_backward_view_13",
        "triton_poi_fused_addmm_gelu_view_5",  # GELU with addmm's bias add, outside the GEMM
        "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
        "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::"
        "{lambda(c10::BFloat16)#1}, std::array<char*, 2ul> >",
    ],
    "casts": [
        "triton_poi_fused__to_copy_7",
        "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)"
        "::{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::{lambda(float)#1}, "
        "std::array<char*, 2ul>, 4, TrivialOffsetCalculator<1, unsigned int>>",
    ],
    "other": [
        "void at::native::(anonymous namespace)::indexSelectLargeIndex<float, long, unsigned int, 2, 2, -2, true>",
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
        "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>",
        "triton_red_fused_sum_view_11",
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >",
    ],
}


@pytest.mark.parametrize("cls", list(NAMES))
def test_each_kernel_name_falls_in_its_class(cls):
    assert [kernels.kernel_class(name) for name in NAMES[cls]] == [cls] * len(NAMES[cls])


def test_the_classes_are_the_profile_tables_rows():
    assert set(NAMES) == set(kernels.CLASSES)


def kernel(name, ts, dur):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7}


GEMM, ADAM = NAMES["matmul"][0], NAMES["optimizer"][0]
NORM, GELU = NAMES["norm+dropout+residual"][0], NAMES["activation"][0]


def two_steps():
    """Two steps of four kernels, a GEMM on a second stream overlapping the layer norm, each step
    inside a ProfilerStep range and the AdamW kernel inside the optimizer's annotation range (on the
    host and on the device), beside CPU ops and runtime calls."""
    events = []
    for step, t0 in enumerate((0.0, 1000.0)):
        events += [
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "ts": t0, "dur": 900.0},
            {"ph": "X", "cat": "gpu_user_annotation", "name": f"ProfilerStep#{step}", "ts": t0, "dur": 900.0},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": t0 + 1, "dur": 50.0},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t0 + 2, "dur": 5.0},
            kernel(GEMM, t0 + 100, 200),
            kernel(NORM, t0 + 250, 100),  # overlaps the GEMM's last 50 us (another stream)
            kernel(GELU, t0 + 400, 100),
            {"ph": "X", "cat": "gpu_user_annotation", "name": "Optimizer.step#AdamW.step", "ts": t0 + 590,
             "dur": 220.0},
            {"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#AdamW.step", "ts": t0 + 580, "dur": 240.0},
            kernel(ADAM, t0 + 600, 200),
            {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "ts": t0 + 820, "dur": 10.0},
        ]
    return events


def test_the_profile_counts_kernels_only_and_overlaps_once():
    table = kernels.profile_table(two_steps(), steps=2)
    assert set(table["kernels"]) == {GEMM, NORM, GELU, ADAM}  # no annotation range, CPU op or memset
    assert table["classes"]["optimizer"] == {"ms": 0.2, "launches": 1.0}  # the kernel, not its 0.22 ms range
    assert table["classes"]["matmul"]["ms"] == pytest.approx(0.2)
    assert table["classes"]["norm+dropout+residual"]["ms"] == pytest.approx(0.1)
    # per step: kernels from 100 to 800 us; busy = [100, 350) + [400, 500) + [600, 800) = 550 us
    assert table["window_ms"] == pytest.approx((1800 - 100) / 2 / 1000)  # first kernel's start to last one's end
    assert table["busy_ms"] == pytest.approx(0.55)
    summed = sum(c["ms"] for c in table["classes"].values())
    assert summed == pytest.approx(0.6) and table["busy_ms"] < summed  # the overlap counts once in busy
    assert table["busy_share"] <= 1
    assert table["idle_ms"] == pytest.approx(table["window_ms"] - table["busy_ms"])


def test_busy_share_stays_at_most_one_when_every_kernel_overlaps():
    events = [kernel(GEMM, 0, 100), kernel(GEMM, 0, 100), kernel(NORM, 50, 100), kernel(GELU, 10, 20)]
    table = kernels.profile_table(events, steps=1)
    assert table["busy_ms"] == pytest.approx(0.15) and table["busy_share"] == pytest.approx(1.0)


def test_a_trace_without_kernels_has_no_busy_share():
    table = kernels.profile_table([{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5}], steps=1)
    assert table["busy_ms"] == 0 and table["busy_share"] is None


def test_an_older_top_kernel_list_is_classified_without_its_annotation_ranges():
    totals = {GEMM: 1.45, "Optimizer.step#AdamW.step": 1.21, ADAM: 1.18, "ProfilerStep#4": 18.0, NORM: 1.15}
    by_class = kernels.classify_totals(totals)
    assert by_class["optimizer"] == 1.18 and by_class["matmul"] == 1.45
    assert sum(by_class.values()) == pytest.approx(1.45 + 1.18 + 1.15)


TINY = kernels.StepShape(tokens=2 * 4, hidden=4, intermediate=8, layers=1, parameters=100, linear_parameters=60,
                         activation_bytes=2)


def test_the_byte_floors_of_a_tiny_bf16_step():
    assert kernels.step_bytes(TINY) == {
        "optimizer": 100 * (24 + 4 + 4),  # AdamW on fp32 masters, the fp32 gradient, the clip's norm read
        "norm+dropout+residual": 3 * 8 * 4 * (7 * 2 + 2),  # 3 layer norms x 8 tokens x 4 hidden
        "activation": 1 * 8 * 8 * 5 * 2,  # 1 layer x 8 tokens x 8 intermediate
        "casts": 60 * (4 + 2),  # each Linear weight read in fp32, written in bf16
    }


def test_bf16_compute_weights_move_no_cast_and_bf16_gradients():
    pure = kernels.step_bytes(kernels.StepShape(**{**TINY.__dict__, "low_precision_weights": True}))
    assert pure["casts"] == 0
    assert pure["optimizer"] == 100 * (24 + 2 + 2 + 2)  # bf16 gradient read twice, the bf16 weights written
    fp32 = kernels.step_bytes(kernels.StepShape(**{**TINY.__dict__, "activation_bytes": 4, "clip": False,
                                                   "dropout": False}))
    assert fp32 == {"optimizer": 100 * 28, "norm+dropout+residual": 3 * 8 * 4 * 28, "activation": 8 * 8 * 20,
                    "casts": 0}


def test_the_floors_put_flops_at_the_peak_and_bytes_at_the_bandwidth():
    floors = kernels.step_floors({"matmul": 2e9, "attention": 5e8}, TINY, peak_tflops=1000.0, bandwidth_tbs=1.0)
    assert floors["matmul"] == pytest.approx(2e9 / 1e15 * 1e3)  # ms
    assert floors["attention"] == pytest.approx(5e8 / 1e15 * 1e3)
    assert floors["optimizer"] == pytest.approx(3200 / 1e12 * 1e3)
    assert floors["casts"] == pytest.approx(360 / 1e12 * 1e3)
    assert floors["other"] is None
    unknown = kernels.step_floors({"matmul": 2e9}, TINY, peak_tflops=None, bandwidth_tbs=None)
    assert set(unknown.values()) == {None}


def test_the_table_rows_put_each_class_beside_its_floor():
    table = kernels.profile_table(two_steps(), steps=2)
    floors = {**dict.fromkeys(kernels.CLASSES), "matmul": 0.1, "optimizer": 0.05}
    rows = {row["class"]: row for row in kernels.floor_rows(table, floors)}
    assert rows["matmul"]["ratio"] == pytest.approx(2.0) and rows["optimizer"]["ratio"] == pytest.approx(4.0)
    assert rows["other"]["ratio"] is None
    assert rows["busy (union)"]["ms"] == pytest.approx(0.55) and rows["busy (union)"]["floor ms"] == pytest.approx(0.15)


def test_the_bandwidth_table_matches_like_the_peak_table():
    assert kernels.peak_bandwidth_tbs("NVIDIA H100 80GB HBM3") == 3.35
    assert kernels.peak_bandwidth_tbs("NVIDIA H200") == 4.8
    assert kernels.peak_bandwidth_tbs("NVIDIA A100-SXM4-80GB") == 2.039
    assert kernels.peak_bandwidth_tbs("NVIDIA GeForce RTX 4070") is None
    # every device with a bandwidth has a peak, so no class gets a floor the other kind cannot match
    assert all(telemetry.peak_tflops(name, "bf16") for name in kernels.PEAK_BANDWIDTH_TBS)


def tiny_bert():
    config = BertConfig(vocab_size=10, hidden_size=4, num_hidden_layers=1, num_attention_heads=1,
                        intermediate_size=8, max_position_embeddings=8, type_vocab_size=2, num_labels=3)
    return BertForSequenceClassification(config)


def test_a_models_step_shape_counts_its_parameters_and_linear_weights():
    model = tiny_bert()
    shape = kernels.StepShape.of(model, 2, 4, precision.PrecisionPolicy("bf16", "cpu"))
    # Linear weights and biases: q, k, v, attention output 4x(4x4+4); intermediate 4x8+8; output 8x4+4;
    # pooler 4x4+4; classifier 4x3+3
    assert shape.linear_parameters == 4 * 20 + 40 + 36 + 20 + 15
    # plus embeddings (10 + 8 + 2 rows of 4), their layer norm (8) and the layer's two layer norms (16)
    assert shape.parameters == shape.linear_parameters + 80 + 8 + 16
    assert (shape.tokens, shape.hidden, shape.intermediate, shape.layers) == (8, 4, 8, 1)
    assert shape.activation_bytes == 2 and not shape.low_precision_weights and shape.dropout
    pure = kernels.StepShape.of(model, 2, 4, precision.PrecisionPolicy("bf16-pure", "cpu"))
    assert pure.low_precision_weights
    assert kernels.StepShape.of(model, 2, 4, precision.PrecisionPolicy("fp32", "cpu")).activation_bytes == 4


def test_flops_by_kind_count_a_linear_layers_forward_and_backward_as_matmul():
    layer = torch.nn.Linear(4, 8)
    x = torch.randn(2, 4, requires_grad=True)

    def step():
        layer(x).sum().backward()

    # forward 2 x 2 x 4 x 8; backward twice that (gradients of the input and of the weight)
    assert kernels.count_flops_by_kind(step) == {"matmul": 3 * 2 * 2 * 4 * 8, "attention": 0.0}


def test_a_kernel_whose_name_holds_a_hash_still_counts():
    """aten's element-wise kernels are named after lambdas (`{lambda()#3}`): only the event's category
    tells a kernel from an annotation range such as `Optimizer.step#AdamW.step`."""
    cast = NAMES["casts"][1]
    assert "#" in cast
    table = kernels.profile_table([kernel(cast, 0, 40), {"ph": "X", "cat": "gpu_user_annotation",
                                                         "name": "Optimizer.step#AdamW.step", "ts": 0, "dur": 90}],
                                  steps=1)
    assert table["classes"]["casts"] == {"ms": 0.04, "launches": 1.0} and table["busy_ms"] == pytest.approx(0.04)
