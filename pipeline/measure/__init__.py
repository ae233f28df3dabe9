"""What a run measures beside its scores: FLOPs counted per step shape (flops), the meters of
throughput, memory and energy and the device's facts (telemetry), and the stall detector's tags
(stall: a run whose predictions collapsed is named as such).

May import: errors, names, fsutil, layout, config, runtime.
"""
