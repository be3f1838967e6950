"""Shared pieces of the benchmarks, by concern (benchmarks/README.md lists the benchmarks):

- `harness.machine`: repository root, threads, device and synchronisation, the host's
  description, the common command-line options (`base_argparser`) and `log`;
- `harness.data`: Multi30k, the cached tokenizer, identical batches for both sides;
- `harness.peers`: our Transformer and MarianMTModel with the same dimensions, the training step
  both get, and the JoeyNMT worker (the RNN benchmark's peer);
- `harness.timing`: statistics of paired rounds, and the FLOP counts and matmul rates behind MFU;
- `harness.results`: number formats, tables, goal rows and the JSON result files.

Every benchmark compares our model with the peer a user would pick instead, in the same process
where possible, with both sides interleaved (A B B A ...) so that drifting machine load hits both
equally. Numbers are medians over repeats with the spread given as the inter-quartile range.

A benchmark script (run as `python benchmarks/<script>.py`, so benchmarks/ is on sys.path) imports
`from harness.<module> import ...`. Importing any of them makes the process offline.
"""

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
