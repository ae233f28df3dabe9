"""What a run measures beside its scores: FLOPs counted per step shape (flops), the meters of
throughput and memory, the device's facts and StageMeters (telemetry), GPU energy (energy), the
batch finder's memory accounting (memory), what a saved model costs to serve (inference), where
a GPU step's kernel time goes against each part's floor (kernels), and the tags of a run whose
predictions collapsed to a trivial answer (collapse).

May import: errors, names, fsutil, layout, tasks, config, runtime.

Inside, lowest first: collapse energy flops kernels load memory | telemetry | inference
"""
