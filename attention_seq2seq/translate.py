"""``python -m attention_seq2seq.translate ...``: the ``translate`` command as a module, for launchers
of several processes (docs/translate.md):

    accelerate launch --num_processes 2 -m attention_seq2seq.translate -m MODEL -i IN -o OUT
    torchrun --nproc_per_node 2 -m attention_seq2seq.translate -m MODEL -i IN -o OUT

Each rank translates every N-th chunk of the input; rank 0 writes the one output file in order.
"""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main(["translate", *sys.argv[1:]]))
