"""GPU energy from NVML's counter over the measured training segments (EnergyMeter), compile time
left out as the throughput clock leaves it out."""
from __future__ import annotations

import torch


class EnergyMeter:
    """GPU energy from NVML's total-energy counter (mJ since driver load), read at the edges
    of each measured segment; plus the mean GPU utilization sampled once a second while
    measuring.

    An epoch is start() ... stop(); pause() and resume() leave out what happens between them
    (a mid-epoch checkpoint), the same window the throughput clock leaves out. With `compiled`,
    the energy drawn while torch.compile compiles is left out as the throughput clock leaves out
    its seconds: the counter is read again at the edges of each compilation (Dynamo's compile
    start/end callbacks, torch/_dynamo/callback.py, for a traced frame and a lazily compiled
    backward; CUDA graph recording, which runs the step's kernels, stays in). Measured, not power
    x time: while the host compiles the GPU idles at a fraction of its training power, so scaling
    the segment's energy by the non-compile share of its time would charge training too little.
    available is False on a CPU, without NVML, or on a GPU whose counter cannot be read: then
    nothing is reported, never a zero or an estimate.
    """

    COMPILE_TRIGGERS = ("DYNAMO", "LAZY_BACKWARD")
    """Dynamo's CallbackTrigger names whose time the throughput clock leaves out (compiler.compile_seconds)."""

    def __init__(self, device: torch.device, compiled: bool = False):
        self.available = False
        self.compiled = compiled
        self.uuid: str | None = None
        self._handle = None
        self._segment_mj: float | None = None
        """The counter at the start of the running segment; None while paused or stopped."""
        self._compile_mj: float | None = None
        """The counter when the running compilation started; None when none runs."""
        self._segment_compile_mj = 0.0
        """Drawn while compiling inside the running segment."""
        self.epoch_joules = 0.0
        self.joules = 0.0
        self.compile_joules = 0.0
        """Left out of `joules`: drawn while compiling inside measured segments."""
        self._util: list[float] = []
        self._stop = None
        if device.type != "cuda":
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self.uuid = "GPU-" + str(torch.cuda.get_device_properties(device).uuid)
            self._handle = pynvml.nvmlDeviceGetHandleByUUID(self.uuid)
            pynvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)  # raises where unsupported
            self._nvml = pynvml
            self.available = True
        except Exception:  # noqa: BLE001 - no NVML, no permission, pre-Volta GPU
            self.available = False

    def start(self) -> None:
        """An epoch: joules and utilization from zero, measuring from now."""
        if not self.available:
            return
        import threading

        self.epoch_joules = 0.0
        self._util = []
        self._stop = threading.Event()
        if self.compiled:
            from torch._dynamo.callback import callback_handler

            callback_handler.register_start_callback(self._compile_started)
            callback_handler.register_end_callback(self._compile_ended)
        self.resume()
        threading.Thread(target=self._sample, daemon=True).start()

    def pause(self) -> None:
        if not self.available or self._segment_mj is None:
            return
        self._compile_ended(None)  # a compilation cut by the pause counts up to here
        drawn = self._counter_mj() - self._segment_mj - self._segment_compile_mj
        self.epoch_joules += drawn / 1000.0
        self.compile_joules += self._segment_compile_mj / 1000.0
        self._segment_mj = None

    def resume(self) -> None:
        if self.available:
            self._segment_mj = self._counter_mj()
            self._segment_compile_mj = 0.0

    def stop(self) -> float:
        """Joules of the epoch's measured segments (0.0 if unavailable; callers check .available)."""
        if not self.available:
            return 0.0
        self.pause()
        self._stop.set()
        if self.compiled:
            from torch._dynamo.callback import callback_handler

            callback_handler.remove_start_callback(self._compile_started)
            callback_handler.remove_end_callback(self._compile_ended)
        self.joules += self.epoch_joules
        return self.epoch_joules

    def _compile_started(self, args) -> None:
        if self._segment_mj is not None and args.callback_trigger.name in self.COMPILE_TRIGGERS:
            self._compile_mj = self._counter_mj()

    def _compile_ended(self, args) -> None:
        if self._compile_mj is not None and self._segment_mj is not None:
            self._segment_compile_mj += self._counter_mj() - self._compile_mj
        self._compile_mj = None

    @property
    def mean_utilization(self) -> float | None:
        return sum(self._util) / len(self._util) if self._util else None

    def _counter_mj(self) -> float:
        return float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))

    def _sample(self) -> None:
        while not self._stop.wait(1.0):
            if self._segment_mj is None:  # paused: a checkpoint write is not training
                continue
            try:
                self._util.append(float(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu))
            except Exception:  # noqa: BLE001
                return
