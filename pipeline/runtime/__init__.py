"""How a process runs: the launcher's environment and process groups (dist), the fallback to the
devices there are (fallback), the precision policy (precision: a mode of config/precision_modes.py
on one device, in torch terms) and the fp32 master weights of a bf16 module (master_weights), the
compile policy and torch.compile (compiler), the Backend seam and
its two implementations, torch and DeepSpeed (backend, torch_backend, deepspeed_backend, factory),
and the collector paused through set-up (gc_pause).

May import: errors, names, fsutil, layout, config. Nothing outside runtime/ asks which backend runs.

Inside, lowest first: backend compiler dist gc_pause master_weights | fallback precision |
deepspeed_backend torch_backend | factory
"""
