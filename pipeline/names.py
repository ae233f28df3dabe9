"""The MLflow names of the pipeline: every metric and tag key that the loop logs and that the
report, the benchmarks and the tests read back. They are a public contract (users build
dashboards on them), so they are spelled once, here.

Task metrics are `eval/<name>` (each epoch, on dev) and `test/<name>` (once, best model);
`<name>` is whatever the task's metrics() returns plus `main` (the task's main metric).
"""
from __future__ import annotations

# ---------------------------------------------------------------- training
TRAIN = "train/"
TRAIN_LOSS = "train/loss"
TRAIN_LR = "train/lr"
TRAIN_GRAD_NORM = "train/grad_norm"
TRAIN_EPOCH = "train/epoch"
TRAIN_EPOCH_LOSS = "train/epoch_loss"  # the epoch's mean loss over its finite steps, logged at its end
TRAIN_STEPS = "train/steps"
TRAIN_EPOCHS = "train/epochs"  # epochs trained (a partial one, stopped by train.max_steps or SIGTERM, counts)
TRAIN_LOSS_TERM = "train/loss_"  # + a named term of the loss (task, kd, hidden, attention, ...)
# at each logged step, over the steps since the previous one (the console line shows the same figures)
TRAIN_SAMPLES_PER_S = "train/samples_per_s"
TRAIN_TOKENS_PER_S = "train/tokens_per_s"  # real (non-padding) tokens
TRAIN_MFU = "train/mfu"  # of the real tokens, on a device in the peak table
TRAIN_PEAK_MEM = "train/peak_mem_mb"  # CUDA allocator's peak this epoch, else the process's peak RSS

# ---------------------------------------------------------------- evaluation
EVAL = "eval/"
TEST = "test/"
EVAL_MAIN = "eval/main"
TEST_MAIN = "test/main"


def train_loss_term(term: str) -> str:
    """A named term of the step loss, over the same window as train/loss."""
    return TRAIN_LOSS_TERM + term


def eval_metric(name: str) -> str:
    return EVAL + name


def test_metric(name: str) -> str:
    return TEST + name


# ---------------------------------------------------------------- model selection (job/parts/best_model.py)
BEST_EPOCH = "best/epoch"  # the epoch (from 1) whose model is best/: the test scores and the final eval/ ones are its
TAG_BEST_REASON = "best/reason"  # why that epoch was chosen, e.g. "f1 0.6100 > 0.5200"
TIE_BREAK = "tie on "  # how best/reason starts where a tie-break chose: "tie on f1 0.0000: map 0.7840 > 0.7000"


# ---------------------------------------------------------------- performance
EPOCH_TIME = "perf/epoch_time_s"
TRAIN_TIME = "perf/train_time_s"
TIME_TO_BEST = "perf/time_to_best_s"
SAMPLES_PER_S = "perf/train_samples_per_s"
TOKENS_PER_S = "perf/train_tokens_per_s"  # real (non-padding) tokens
PADDED_TOKENS_PER_S = "perf/train_padded_tokens_per_s"  # every row at its padded length, as computed
PEAK_MEM_ALLOCATED = "perf/peak_mem_allocated_mb"  # CUDA allocator
PEAK_MEM_RESERVED = "perf/peak_mem_reserved_mb"  # CUDA allocator
PEAK_RSS = "perf/peak_rss_mb"  # CPU: the process's resident set
FLOPS_PER_SAMPLE = "perf/flops_per_sample"  # of the real tokens
TFLOPS = "perf/tflops"  # of the real tokens: each row at its own length
TFLOPS_PADDED = "perf/tflops_padded"  # of the batches as padded and computed
MFU = "perf/mfu"  # of the real tokens
MFU_PADDED = "perf/mfu_padded"  # of the batches as padded and computed
COMPILE_TIME = "perf/compile_s"  # torch.compile's time inside training, left out of every rate
COMPILES = "perf/compiles"  # graphs compiled in this process

# How busy the machine was with other work while the segment was timed (measure/load.py): per epoch
# and for the job under perf/NAME while training, under perf/infer_NAME while the best model was timed.
PERF = "perf/"
LOAD_OTHERS_CPU = "others_cpu_frac"  # mean share of the machine's cores busy with other processes (0-1)
LOAD_OTHERS_CPU_MAX = "others_cpu_frac_max"  # the busiest one-second reading's share
LOAD_OTHERS_GPU_UTIL = "others_gpu_util_pct"  # NVML: other processes' SM utilization on this GPU, %
LOAD_OWN_GPU_SHARE = "own_gpu_share"  # NVML: this job's share of the GPU's SM utilization (0-1)
LOAD_OTHERS_GPU_PROCS = "others_gpu_procs"  # NVML: most other processes running on this GPU at once
INFER_LOAD = "perf/infer_"


def load_metric(quantity: str, prefix: str = PERF) -> str:
    """perf/others_cpu_frac (training) or, with INFER_LOAD, perf/infer_others_cpu_frac (inference)."""
    return prefix + quantity

# ---------------------------------------------------------------- export (pipeline/export/)
# The best model exported (`python -m pipeline export DIR --check`), logged on the stage's run:
# export/VARIANT/QUANTITY, VARIANT being fp32 (ONNX) or int8 (ONNX, weights int8, activations
# quantized at run time): max_abs_diff and agreement against the PyTorch model on the dev split,
# size_mb on disk, and test/NAME, the task's test metrics computed with the exported model.
EXPORT = "export/"
EXPORT_MAX_ABS_DIFF = "max_abs_diff"  # the largest |logit difference| from the PyTorch model, dev split
EXPORT_AGREEMENT = "agreement"  # the share of predictions (argmax) equal to the PyTorch model's, dev split
EXPORT_SIZE_MB = "size_mb"  # the exported graph on disk


def export_metric(variant: str, quantity: str) -> str:
    return f"{EXPORT}{variant}/{quantity}"


def export_test_metric(variant: str, name: str) -> str:
    return f"{EXPORT}{variant}/{TEST}{name}"


# ---------------------------------------------------------------- predictions against a counterpart's (report)
AGREEMENT = "agreement/"
AGREEMENT_QUANTITIES = ("mcnemar_p", "only_reference_right", "only_this_right", "seed_noise")


def agreement_metric(counterpart: str, quantity: str = "") -> str:
    """A compared run's test predictions against its counterpart's of the same seed (report/prediction_pairs):
    `agreement/vs_C` the % that agree; with a quantity, McNemar's p, the units only one side got right,
    and the counterpart's own agreement across two seeds."""
    return f"{AGREEMENT}vs_{counterpart}" + (f"/{quantity}" if quantity else "")


# ---------------------------------------------------------------- model size (measure/flops.ModelSize; once a run)
MODEL_PARAMS = "model/params"
MODEL_PARAMS_NON_EMBEDDING = "model/params_non_embedding"  # outside the embedding tables
MODEL_FORWARD_FLOPS = "model/forward_flops_per_seq"  # one forward of one sequence of train.max_length tokens
# a distilled student's over its teacher's (kd/student.py ratios)
KD_PARAM_RATIO = "kd/student_teacher_param_ratio"
KD_PARAM_RATIO_NON_EMBEDDING = "kd/student_teacher_param_ratio_non_embedding"
KD_FLOPS_RATIO = "kd/student_teacher_flops_ratio"

# ---------------------------------------------------------------- energy (NVML; absent where not measured)
ENERGY_JOULES = "energy/joules"
AVG_POWER = "energy/avg_power_w"
JOULES_PER_SAMPLE = "energy/joules_per_sample"
GPU_UTIL = "energy/gpu_util_pct"

# ---------------------------------------------------------------- AMP health
LOSS_SCALE = "amp/loss_scale"
SKIPPED_STEPS = "amp/skipped_steps"
NONFINITE_LOSSES = "amp/nonfinite_losses"

# ---------------------------------------------------------------- inference (measure/inference.py)
# The best model served: once per stage. Per precision and length the name is
# infer/QUANTITY/PRECISION/LENGTH, LENGTH being `median` (the test split's median length) or `longest`
# (its longest padded length), e.g. infer/latency_ms_p50/fp32/median; their token counts are infer/length/*.
INFER = "infer/"
INFER_PARAMS = "infer/params"
INFER_PARAMS_NO_EMBED = "infer/params_no_embed"  # outside the embedding tables
INFER_SIZE_MB = "infer/size_mb"  # the saved weights on disk
INFER_BATCH = "infer/batch_size"  # the serving batch of samples_per_s
INFER_LATENCY_P50 = "latency_ms_p50"  # batch 1
INFER_LATENCY_P95 = "latency_ms_p95"
INFER_SAMPLES_PER_S = "samples_per_s"  # at the serving batch
INFER_PEAK_MEM = "peak_mem_mb"  # CUDA: the allocator's peak less what was allocated before the model loaded
INFER_PEAK_RSS = "peak_rss_mb"  # CPU: the resident set's high-water mark less the resident set before it loaded
INFER_LENGTHS = ("median", "longest")


def infer_metric(quantity: str, precision: str, length: str) -> str:
    return f"{INFER}{quantity}/{precision}/{length}"


def infer_length(length: str) -> str:
    return f"{INFER}length/{length}"


# ---------------------------------------------------------------- tags
# Every stage run carries these (values: see the README); the study runner adds `study` and
# `procedure`, and marks its own parent run with PARENT_TAG.
TAG_TASK = "task"
TAG_MODEL = "model"
TAG_PRECISION = "precision"  # the resolved policy: fp32 | tf32 | fp16 | bf16
TAG_PRECISION_REQUESTED = "precision_requested"  # the config's precision key (auto included)
TAG_BACKEND = "backend"  # single | ddp | deepspeed
TAG_LAUNCHER = "launcher"  # none | torchrun | deepspeed
TAG_WORLD_SIZE = "world_size"
TAG_NUM_NODES = "num_nodes"
TAG_STAGE = "stage"  # train | distill
TAG_DEVICE = "device"  # the device's name
TAG_DEVICE_TYPE = "device_type"  # cuda | cpu
TAG_CPU_BF16 = "cpu_bf16"  # a CPU run's bf16 hardware: AMX | AVX512-BF16 | none (bf16 emulated, slower than fp32)
TAG_SEED = "seed"
TAG_OUTPUT_DIR = "output_dir"  # the job's output_dir, resolved: an export of a copy of it opens a run of its own
TAG_ENERGY_AVAILABLE = "energy_available"  # true | false: NVML's energy counter on some rank
TAG_STUDY = "study"
TAG_PROCEDURE = "procedure"
TAG_PARENT_RUN = "mlflow.parentRunId"  # MLflow's own: nests a run under its parent in the UI
TAG_GIT_COMMIT = "mlflow.source.git.commit"  # MLflow's own: the run page's and runs table's commit
TAG_SOURCE_NAME = "mlflow.source.name"  # MLflow's own: the runs table's Source, e.g. python -m pipeline train
TAG_SOURCE_TYPE = "mlflow.source.type"  # MLflow's own: LOCAL
TAG_USER = "mlflow.user"  # MLflow's own: the runs table's User, the login that ran the job
TAG_URI_FROM = "tracking.uri_from"  # config | env:MLFLOW_TRACKING_URI | default
TAG_EXPERIMENT_FROM = "tracking.experiment_from"  # config | env:MLFLOW_EXPERIMENT_NAME | default
TAG_KD_CACHE = "kd_cache"  # hit | miss | off
TAG_STUDENT_INIT = "student.init"  # teacher-layers | weight-selection | scratch | pretrained (kd/student.py)
TAG_DATA_CACHE = "data_cache"  # hit | miss | partial: the prepared-features cache (features.py)
TAG_DEV = "dev"  # where dev came from when not from a file of its own: holdout:F:SEED | skip (no dev evaluation)
TAG_NO_TEST = "no_test"  # true: data.test unset beside a given data key, so the run has no test figures
TAG_TEST_IS_TRAIN = "test_is_train"  # true: data.test is data.train's file, so the test figures are of rows trained on
TAG_PRECISION_MODE = "precision_mode"  # autocast | pure16 | fp32: how 16-bit compute was done
TAG_FALLBACK = "fallback"  # true when fewer processes ran than planned (grad_accum made up the rest)
TAG_REQUESTED_WORLD_SIZE = "requested_world_size"  # the world size the global batch was planned for
TAG_RESUMED_WITH_CHANGES = "resumed_with_changes"  # a resumed job went on with changes (accept_changes): which
TAG_SUPERSEDES = "supersedes"  # a job that started over: the run of the unfinished job before it (deleted)
TAG_SUPERSEDED_BY = "superseded_by"  # that run, deleted from the default view: the run of the job that started over
TAG_CELL = "cell"  # a study cell's run: the cell's name
TAG_REPORT_TABLES = "report_tables"  # a study cell's run: the report tables it feeds (comma-separated)
PARENT_TAG = "study_parent"  # "true" on a study's parent run
TAG_STUDY_FILE = "study_file"  # the parent run: the study file it ran
CELL_TAG_PREFIX = "cell."  # parent-run tag per cell: its plan and outcome, as JSON
TAG_STALLED = "stalled"  # true | false: the best model's test predictions collapsed (pipeline/measure/collapse.py)
TAG_STALL_REASON = "stall_reason"  # how they collapsed, e.g. "no entity predicted" (stalled runs only)
TAG_BATCH_FIT = "batch_fit"  # train.batch_size=auto: the split found and its peaks (batch_finder.py)

TAG_TRIAL_FATE = "search/fate"  # a search trial's run: complete | pruned | failed (study/search.py)
TAG_TRIAL_REASON = "search/reason"  # a failed trial's run: why (its job's last line, or its objective unlogged)

# ---------------------------------------------------------------- a study's parent run
STUDY_CELLS_FINISHED = "study/cells_finished"
STUDY_CELLS_FAILED = "study/cells_failed"

