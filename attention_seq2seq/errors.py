"""The one exception type the command line turns into a one-line message (exit status 2)."""


class UserError(Exception):
    """A mistake the user can fix (a missing folder, a bad option value); not a bug.

    The command line prints ``attention-seq2seq <command>: error: <message>`` and exits with 2,
    without a traceback.
    """
