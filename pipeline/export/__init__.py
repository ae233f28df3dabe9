"""A stage's best model as it is served: exported to ONNX (fp32, and int8 dynamically quantized),
checked against the PyTorch model it came from, its figures and the served graph logged on the
stage's MLflow run, optionally of the model with its vocabulary cut to the training data's tokens
(`python -m pipeline export DIR [--int8] [--check] [--trim-vocab]`, commands/export.py).

May import: errors, names, fsutil, layout, tasks, runtime, measure, data, models, evaluation,
tracking; never plan, stage, train, jobs, report, study or the CLI. ONNX Runtime and onnx are
imported where used (the `[export]` extra).

Inside, lowest first: onnx_model trim_vocab | check logged | stage_export
"""
