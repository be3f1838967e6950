"""The machine a benchmark runs on and how it runs there: the repository, threads, device,
synchronisation, the host's description (in every result file), the shared command-line options
and the log line."""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_THREADS = 2


def set_threads(num_threads: int = DEFAULT_THREADS) -> int:
    """Fix torch's intra-op threads (and one inter-op thread) so both sides run alike."""
    import torch

    torch.set_num_threads(num_threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set in this process
        pass
    return torch.get_num_threads()


def resolve_device(name: str) -> str:
    """'cpu', 'cuda' or 'auto' (cuda when torch sees a GPU, else cpu) -> a torch device string.

    Asking for 'cuda' where torch sees none ends the benchmark with one line (SystemExit), not a
    traceback from the first tensor moved there.
    """
    import torch

    if name not in ("cpu", "cuda", "auto"):
        raise SystemExit(f"--device must be one of 'auto', 'cpu', 'cuda'; got {name!r}")
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            f"--device cuda: torch {torch.__version__} sees no CUDA device on this machine "
            "(use --device cpu, or run on a GPU machine)"
        )
    return name


def sync(device: str) -> None:
    """Wait for the device's queued kernels, so a host clock read after it times finished work."""
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def to_device(batch: dict, device: str) -> dict:
    return {k: v.to(device) for k, v in batch.items()}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict:
    import torch
    import transformers

    info = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu_model": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": "cuda:" + torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "load_avg_1min": os.getloadavg()[0],
    }
    return info


def base_argparser(description: str):
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="few repeats: a smoke test of the harness")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("BENCH_THREADS", DEFAULT_THREADS)))
    parser.add_argument(
        "--device",
        default=os.environ.get("BENCH_DEVICE", "cpu"),
        choices=("auto", "cpu", "cuda"),
        help="where both sides run (default cpu; auto: cuda when torch sees a GPU)",
    )
    return parser


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
