"""Python's garbage collector around a job's set-up, in the CLI's process.

Set-up (importing torch, transformers, MLflow and sklearn; building the model; preparing the
data) makes about half a million objects that live as long as the process. With the collector
on, each time the heap grows by a quarter a full collection walks all of them again: 9 full
collections, ~5 s of CPU, in a 2-step stage of ~25 s on the 2-core development machine; and the
interpreter's last collection at exit walks them once more. So `python -m pipeline` pauses the
collector for a stage before anything is imported, and the stage turns it back on when it is set
up (job/run.run), with what set-up made frozen (moved where no collection walks it): the loop's
collections then walk only what the loop makes. Other commands keep it on. Code that calls
`pipeline.job.run.run` itself (a notebook, the tests) never paused it and is left as it is.
"""
import gc

from pipeline import job_record  # the kinds of job: the commands whose set-up run() ends

_paused = False


def pause_for_setup(argv: list[str]) -> None:
    """Before anything is imported: the collector off when the command in `argv` is a stage."""
    global _paused
    # the deepspeed launcher puts --local_rank=N before the command's own arguments
    command = next((a for a in argv if not a.startswith("--local")), None)
    if command in job_record.KINDS:
        _paused = gc.isenabled()
        gc.disable()


def resume_after_setup() -> None:
    """Collection back on, set-up's objects frozen; a no-op unless pause_for_setup paused it."""
    global _paused
    if _paused:
        gc.freeze()
        gc.enable()
        _paused = False


def skip_final_collection() -> None:
    """The command is done: freeze everything, so that the interpreter's final collection walks
    nothing (atexit handlers, MLflow's and logging's among them, still run before it)."""
    gc.freeze()
