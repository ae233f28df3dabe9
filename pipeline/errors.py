"""The exceptions the CLI tells in one line: the user's input is wrong (2), the machine failed (1),
Ctrl-C (130)."""


class UserError(Exception):
    """Wrong config, data, path or launch combination.

    The message is one line that names the thing (key, file, row) and the reason;
    the CLI prints it without a traceback and exits with code 2.
    """


class MachineError(Exception):
    """The machine or its files failed, not the input (a checkpoint that passed its checks but
    cannot be loaded): one line, exit code 1."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped a command once it had something to say about it: `survived` is what it
    leaves (a checkpoint, finished cells), `again` the key=value arguments that continue it
    (resume=auto) added to the same command. The CLI prints it as one line, exit code 130."""

    def __init__(self, survived: str, again: tuple[str, ...] = ()):
        super().__init__(survived)
        self.survived, self.again = survived, again
