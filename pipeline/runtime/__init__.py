"""How a process runs: who and where it is, the backend it resolved to and its process group
(world), the collectives and named figures the ranks share (collectives), SIGTERM agreed on by
every rank (preemption), the fallback to the devices there are (fallback), the precision policy
(precision: a mode of config/precision_modes.py on one device, in torch terms) and the fp32 master
weights of a bf16 module (master_weights), the compile policy and torch.compile (compiler), the
Backend seam and its two implementations, torch and DeepSpeed (backend, torch_backend,
deepspeed_backend, factory), and the collector paused through set-up (gc_pause).

May import: errors, names, fsutil, layout, config. Nothing outside runtime/ asks which backend runs:
what it needs to know of it, runtime answers (world.Runtime.checkpoint_layout, world.resume_refusal,
the Backend's own methods).

Inside, lowest first: backend collectives compiler gc_pause master_weights | preemption world |
fallback precision | deepspeed_backend torch_backend | factory
"""
