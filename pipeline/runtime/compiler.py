"""`train.compile`: its policy (CompilePolicy, every question the stage asks about compilation,
answered once), and torch.compile for the trained module, the frozen teacher and evaluation.

A module is compiled in place (nn.Module.compile), so its state_dict keeps its own keys (no
`_orig_mod.` prefix): checkpoints, best/ and resume are the same compiled or not, and a job can
resume under the other setting. Shapes are static (dynamic=False): each distinct batch shape is
one specialized graph, and data.loaders.collate_shaped keeps those few (lengths padded to buckets, short
batches filled), which is also what CUDA graphs (`reduce-overhead`) need to replay.

Compilation happens inside the first steps of each new shape; its time is read from Dynamo's
own accounting and left out of the throughput clock (telemetry.ThroughputMeter), and logged on
its own (perf/compile_s), with the number of graphs compiled (perf/compiles).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from pipeline.config.deepspeed_files import zero_stage_of

log = logging.getLogger("pipeline")

RECOMPILE_LIMIT = 64
"""Dynamo's limit of compiled variants per function (its default, 8, is below the shapes a job can
meet: length buckets x {train, eval} x {full, filled}); past it Dynamo runs eager silently."""

WARN_COMPILES = 16
"""More compilations than this in one process: a warning (something varies per batch)."""


CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
"""The modes whose inductor options turn CUDA graphs on (torch/_inductor/__init__.py,
list_mode_options: triton.cudagraphs)."""


@dataclass(frozen=True)
class CompilePolicy:
    """What `train.compile` means for a stage, settled once (job/plan.py) and held by the plan and
    the backend: the loop, loaders, evaluation, the KD teacher and the meters ask it, never the raw
    setting."""

    mode: str
    """off | default | reduce-overhead | max-autotune (never auto)."""
    reason: str
    """Why this mode: the run's resolved.compile_reason param."""

    @property
    def compiled(self) -> bool:
        return self.mode != "off"

    @property
    def cuda_graphs(self) -> bool:
        return self.mode in CUDA_GRAPH_MODES

    def fill_short_batches(self, distilling: bool) -> bool:
        """Fill the epoch's short batch to full rows, so its graph is one already compiled (and a
        CUDA graph replays); not under KD, whose loss would count the filler rows."""
        return self.compiled and not distilling

    @staticmethod
    def drop_mask(host_mask: torch.Tensor) -> bool:
        """Whether a training batch reaches the model without its attention mask: when it has no
        padding, in every mode (read on the host copy: no device sync). Eager, transformers' SDPA
        path would otherwise ask the device whether the mask is all ones (masking_utils
        `_ignore_bidirectional_mask_sdpa`); compiled, it never drops a mask while tracing (the same
        function checks is_tracing), so SDPA could not take its flash kernel. The cost: a bucket
        whose batches come both padded and unpadded compiles two graphs, one with a mask and one
        without, so a job meets at most twice its length buckets in training graphs."""
        return bool(host_mask.all())

    def begin_step(self) -> None:
        """Under CUDA graphs, a new generation of graph trees: before the first micro-batch of an
        optimizer step, and only there, and before each evaluation or teacher batch (no gradients,
        nothing kept from the last batch but copies, so every such batch may start one). A mark
        starts a new generation of cudagraph trees, which frees every output of the last one still alive
        (torch/_inductor/cudagraph_trees.py: `can_start_new_generation`, then
        `dealloc_current_path_weakrefs`). After zero_grad(set_to_none=True) the first micro-batch's
        `.grad` tensors are outputs of the captured backward (AccumulateGrad keeps the tensor it is
        given); a mark before the second micro-batch would free them while the parameters still hold
        them, and the second backward would accumulate into reclaimed memory. Without a mark inside
        the group, cudagraph trees record micro-batch k as a child of micro-batch k-1's backward, with
        that backward's outputs live (its allocations never overlap them), and the accumulation into
        `.grad` is an eager in-place add on memory nothing else writes. The step zeroes `.grad` to
        None, so at the next mark nothing alive refers to the freed generation."""
        if self.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()

    def compile(self, module: torch.nn.Module) -> torch.nn.Module:
        """Compile `module` in place for this mode (off: unchanged); returns it."""
        return compile_module(module, self.mode)

    def describe(self) -> dict[str, str]:
        """The run's resolved.* params: what was chosen and why."""
        return {"compile": self.mode, "compile_reason": self.reason}


OFF = CompilePolicy("off", "train.compile=off")


def resolve(requested: str, device_type: str, backend: str, deepspeed: str | None = None) -> CompilePolicy:
    """`train.compile` for this device (cuda | cpu) and backend (single | ddp | deepspeed, with the
    ZeRO stage of its `deepspeed` config); `auto` picks what has been measured to work and pay there
    (benchmarks/README.md)."""
    if requested != "auto":
        return CompilePolicy(requested, f"train.compile={requested} (set)")
    if device_type != "cuda":
        return CompilePolicy("off", "auto on a CPU: inductor's warm-up costs minutes there and its steps "
                                    "were no faster (benchmarks/results/compile-*.json)")
    zero_stage = zero_stage_of(deepspeed) if backend == "deepspeed" else 0
    if backend == "deepspeed" and zero_stage == 3:
        # ZeRO-3's parameter gather/release hooks are @torch.compiler.disable
        # (deepspeed/runtime/zero/parameter_offload.py): a graph break at every submodule, and CUDA graphs
        # would record each piece over freshly gathered buffers (re-records torch does not count)
        return CompilePolicy("off", "auto under DeepSpeed ZeRO-3: its parameter hooks break the graph at "
                                    "every submodule; no compiled ZeRO-3 step has been measured")
    if backend == "deepspeed":
        # the engine is not DDP: Dynamo does not split the compiled backward at gradient buckets, so
        # ZeRO-1/2's overlap_comm has nothing to overlap; CUDA graphs under its gradient hooks are unmeasured
        return CompilePolicy("off", f"auto under DeepSpeed ZeRO-{zero_stage}: no compiled DeepSpeed step has "
                                    "been measured on a GPU")
    if backend == "ddp":
        # CUDA graphs beside DDP's gradient hooks (Dynamo splitting the graph at buckets) have not passed
        # on a GPU: benchmarks/gpu_check.py's ddp check runs them against one process; until it passes
        # there, auto keeps what has (eager DDP, the CPU suite's and the fallback's path)
        reason = ("auto under DDP on a GPU: CUDA graphs beside DDP's gradient hooks have not passed the GPU check "
                  "yet (benchmarks/gpu_check.py, ddp); eager until they have")
        log.info("train.compile=auto -> off: %s", reason)
        return CompilePolicy("off", reason)
    return CompilePolicy("reduce-overhead", "auto on a GPU: CUDA graphs, as a small or medium step is bound "
                                            "by kernel launches (benchmarks/results/compile-*.json)")


def compile_module(module: torch.nn.Module, mode: str) -> torch.nn.Module:
    """Compile `module` in place for `mode` (off: unchanged); returns it."""
    if mode == "off":
        return module
    allow_shapes()
    module.compile(**compile_kwargs(mode))
    return module


def allow_shapes() -> None:
    """Raise Dynamo's per-function limit of compiled variants to RECOMPILE_LIMIT."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)


def compile_kwargs(mode: str) -> dict:
    """torch.compile's arguments for `mode` (DeepSpeed's engine.compile takes the same)."""
    return {"mode": None if mode == "default" else mode, "dynamic": False}


def compile_seconds() -> float:
    """Seconds this process has spent compiling (Dynamo's frames and AOT backward graphs)."""
    from torch._dynamo.utils import calculate_time_spent

    return float(calculate_time_spent().get("total_wall_time", 0.0))


def compiles() -> int:
    """Graphs Dynamo has compiled in this process (each new shape or mode is one more)."""
    from torch._dynamo.utils import counters

    return int(counters["frames"]["ok"])
