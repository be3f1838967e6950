"""The one exception type the command line turns into a one-line message (exit status 2)."""


class UserError(Exception):
    """A mistake the user can fix (a missing folder, a bad option value); not a bug.

    The command line prints ``attention-seq2seq <command>: error: <message>`` and exits with 2,
    without a traceback.
    """


def did_you_mean(name: str, valid, n: int = 3, cutoff: float = 0.6) -> str:
    """``" (did you mean 'a', 'b'?)"`` for the entries of ``valid`` closest to ``name``
    (``difflib.get_close_matches``), or ``""`` when none is close: the tail of an
    "unknown option" message. (Shipped configuration code keeps its own copy: an export may
    import nothing from this package.)"""
    import difflib

    close = difflib.get_close_matches(name, list(valid), n=n, cutoff=cutoff)
    return f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
