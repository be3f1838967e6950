"""How long the attention explorer takes to show its first translation, measured in the browser.

A Transformer-small-sized model (multi30k-transformer-small.yaml: 3 + 3 layers, d_model 256,
8 heads, FFN 1024, 8,000-piece vocabulary; 7.6 M parameters) with untrained, seeded weights and
a fixed output length (``--tgt-tokens``, default 20 subwords, about a Multi30k sentence: an
untrained model would otherwise run to max_new_tokens) is served by the explorer (as
``attention-seq2seq demo`` does); headless Chromium (Debian's) types a German sentence, presses
Translate and waits for the heat-map. The time from the click to the heat-map in the page is
printed for the first translation after the server started (greedy), a repeat, then beam search
(beam 5) twice; the server's own time for translating and collecting the attention (shown under
the candidates) beside it. Servers with and without ``warm_up`` alternate (``--rounds``), so both
see the same machine load.

A measurement, not a test. On a shared machine the numbers include the other processes' load:
name the host and the load with them.

    .venv/bin/python benchmarks/bench_explorer.py [--threads 2] [--tgt-tokens 20]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE = "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt."
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def build_model(folder: Path, tgt_tokens: int) -> None:
    import torch
    from transformers import AutoModelForSeq2SeqLM

    sys.path.insert(0, str(REPO / "benchmarks"))
    from harness.data import build_tokenizer

    from attention_seq2seq import TransformerSeq2SeqConfig

    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    config = TransformerSeq2SeqConfig(
        vocab_size=len(tokenizer),
        d_model=256,
        encoder_layers=3,
        decoder_layers=3,
        encoder_attention_heads=8,
        decoder_attention_heads=8,
        encoder_ffn_dim=1024,
        decoder_ffn_dim=1024,
        norm_order="pre",
    )
    model = AutoModelForSeq2SeqLM.from_config(config).eval()
    model.generation_config.max_new_tokens = tgt_tokens
    model.generation_config.min_new_tokens = tgt_tokens
    model.generation_config.num_beams = 5
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters, {tgt_tokens} output tokens")


_SERVE = (
    "import sys; from attention_seq2seq.translation.loading import load_for_inference; "
    "from attention_seq2seq.explorer_app import build_app, launch; "
    "loaded = load_for_inference(sys.argv[1], device='cpu', attn_implementation='eager'); "
    "launch(build_app(loaded.model, loaded.tokenizer, warm=sys.argv[3] == 'warm'), port=int(sys.argv[2]), quiet=True)"
)


def serve(model_dir: Path, warm: bool, threads: int) -> tuple[subprocess.Popen, int, float]:
    """Start the app (with or without the warm-up) on a free port; returns (process, port, seconds to up)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1")
    started = time.perf_counter()
    server = subprocess.Popen(
        [sys.executable, "-c", _SERVE, str(model_dir), str(port), "warm" if warm else "cold"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    while True:
        if server.poll() is not None:
            raise RuntimeError(f"the app exited with {server.returncode}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2)
            return server, port, time.perf_counter() - started
        except OSError:
            time.sleep(0.2)


def measure(browser, port: int, settle: float) -> dict[str, tuple[float, str]]:
    """Click-to-heat-map seconds (and the server's own time) of four translations in a fresh page."""
    page = browser.new_page()
    page.goto(f"http://127.0.0.1:{port}/", wait_until="load")
    page.wait_for_selector("#translate")
    page.locator("#source textarea").fill(SOURCE)
    page.wait_for_timeout(settle * 1000)
    results = {}
    for name, mode in (
        ("greedy, first", "greedy"),
        ("greedy, again", "greedy"),
        ("beam 5", "beam search"),
        ("beam 5, again", "beam search"),
    ):
        page.locator("#mode").get_by_text(mode, exact=True).click()
        if mode == "beam search":
            page.locator("#beams input[type=number]").fill("5")
            page.locator("#beams input[type=number]").press("Enter")
        run = len(results) + 1
        t0 = time.perf_counter()
        page.locator("#translate").click()
        page.wait_for_selector(f"#candidates [data-run='{run}']", timeout=300000)
        page.wait_for_selector("#heatmap table.attn-map", timeout=300000)
        seconds = time.perf_counter() - t0
        note = page.locator(f"#candidates [data-run='{run}']").inner_text().split(" in ")[-1]
        results[name] = (seconds, note)
    page.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of the server (default 2)")
    parser.add_argument("--tgt-tokens", type=int, default=20)
    parser.add_argument(
        "--settle",
        type=float,
        default=3.0,
        help="seconds between the page showing and the first click, as a person typing (default 3)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="server starts per variant, interleaved (default 3)")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    work = Path(tempfile.mkdtemp(prefix="bench_explorer_"))
    build_model(work / "model", args.tgt_tokens)
    first: dict[str, list[float]] = {"warm": [], "cold": []}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=FLAGS)
        for round_ in range(args.rounds):
            for variant in ("warm", "cold"):  # interleaved: both see the same machine load
                server, port, up = serve(work / "model", variant == "warm", args.threads)
                try:
                    results = measure(browser, port, args.settle)
                finally:
                    server.terminate()
                    server.wait()
                first[variant].append(results["greedy, first"][0])
                cells = " | ".join(f"{name} {sec:.2f} s (server {note})" for name, (sec, note) in results.items())
                print(f"round {round_ + 1} {variant:4s} (up in {up:.0f} s): {cells}", flush=True)
        browser.close()
    medians = {variant: statistics.median(values) for variant, values in first.items()}
    print(
        f"first translation, click to heat-map, median of {args.rounds}: with warm-up {medians['warm']:.2f} s, "
        f"without {medians['cold']:.2f} s (ratio {medians['cold'] / medians['warm']:.1f}x)"
    )
    print(json.dumps({"first_translation_s": first, "median_s": medians}))


if __name__ == "__main__":
    main()
