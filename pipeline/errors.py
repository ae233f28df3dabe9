"""The one exception type that means "the user's input is wrong" (exit code 2)."""


class UserError(Exception):
    """Wrong config, data, path or launch combination.

    The message is one line that names the thing (key, file, row) and the reason;
    the CLI prints it without a traceback and exits with code 2.
    """


class MachineError(Exception):
    """The machine or its files failed, not the input (a checkpoint that passed its checks but
    cannot be loaded): one line, exit code 1."""
