"""One benchmark side per worker process (bench_ct2.py, bench_onnx.py), as a user runs one
backend: OpenMP and onnxruntime thread pools spin-wait after their parallel regions and slowed
each other inside one process. The parent sends "BEAMS INDEX" lines; the worker answers each with
the seconds that translating batch INDEX took, timed inside the worker (the pipe is not timed)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Callable


def serve(translate: Callable[[int, int], None], info: dict) -> None:
    """The worker's side: warm up (greedy and beam 5 on batch 0), print ``info`` as the ready line,
    then answer "BEAMS INDEX" lines with the seconds of ``translate(index, beams)``; "quit" ends."""
    for beams in (1, 5):
        translate(0, beams)
    print(json.dumps(info), flush=True)
    for line in sys.stdin:
        if line.strip() == "quit":
            break
        beams, index = map(int, line.split())
        start = time.perf_counter()
        translate(index, beams)
        print(json.dumps(time.perf_counter() - start), flush=True)


class WorkerSide:
    """The parent's handle on one worker process started with ``command``."""

    def __init__(self, name: str, command: list[str]) -> None:
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = self.process.stdout.readline()
        if not ready:
            raise SystemExit(f"the {name} worker did not start (see its error above)")
        self.info = json.loads(ready)

    def translate(self, beams: int, index: int) -> float:
        self.process.stdin.write(f"{beams} {index}\n")
        self.process.stdin.flush()
        return float(json.loads(self.process.stdout.readline()))

    def close(self) -> None:
        self.process.stdin.write("quit\n")
        self.process.stdin.close()
        self.process.wait(timeout=60)
