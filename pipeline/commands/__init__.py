"""Every subcommand of `python -m pipeline`, in one kind of place: a function here that takes the
command's argument list, parses it and makes one call into the package that does the work,
returning the exit code. `pipeline/cli.py` picks the function by the command's name (COMMANDS),
imports it on first use (a command pays for no other's imports) and turns exceptions into exit
codes.

May import: everything below the CLI (jobs, study, report, ui and what they use).

Inside, lowest first: config_reference export infer_bench report stage study sync ui
"""
