"""What a run measures beside its scores: FLOPs counted per step shape (flops), the meters of
throughput and memory, the device's facts and StageMeters (telemetry), GPU energy (energy), the
batch finder's memory accounting (memory) and its search (batch_fit), what a saved model costs to serve (inference), how
busy the machine was meanwhile (load), and the tags of a run whose predictions collapsed to a
trivial answer (collapse). A GPU step's kernel profile is a benchmark's (benchmarks/kernel_profile.py).

May import: errors, names, fsutil, layout, tasks, config, runtime.

Inside, lowest first: collapse energy flops load memory | batch_fit telemetry | inference
"""
