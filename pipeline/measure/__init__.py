"""What a run measures beside its scores: FLOPs counted per step shape (flops), the meters of
throughput and memory, the device's facts and StageMeters (telemetry), GPU energy (energy), the
batch finder's memory accounting (memory), what a saved model costs to serve (inference), where
a GPU step's kernel time goes against each part's floor (kernels), and the stall detector's tags
(stall: a run whose predictions collapsed is named as such).

May import: errors, names, fsutil, layout, config, runtime.
"""
