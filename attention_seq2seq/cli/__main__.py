"""``python -m attention_seq2seq.cli ...``: the ``attention-seq2seq`` command (cli/ is a package
since the redesign, so ``-m`` runs this module rather than ``cli/__init__.py``'s ``__main__``
block)."""

import sys

from . import main

sys.exit(main())
