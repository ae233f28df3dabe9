"""How a process runs: the launcher's environment and process groups (dist), the fallback to the
devices there are (fallback), the precision policy (precision), the compile policy and torch.compile
(compiler), the Backend seam and its two implementations, torch and DeepSpeed (backend,
torch_backend, deepspeed_backend, factory), and the collector paused through set-up (gc_pause).

May import: errors, names, fsutil, layout, config. Nothing outside runtime/ asks which backend runs.
"""
