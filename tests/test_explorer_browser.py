"""The attention explorer in a real browser: Debian's headless Chromium, driven by playwright.

1. ``attention-seq2seq demo`` on a tiny trained 2-layer Transformer: type a sentence, Translate
   (greedy, then beam search), switch layer, head and view. The translation shown must equal
   ``generate``'s for the same settings, and the heat-map shown (its table's ``data-weights``,
   the plotted array) must equal ``output_attentions`` for the chosen layer and head, and change
   with the head.
2. The Space folder of ``export --space`` started as ``python app.py`` with this package hidden
   (the app runs on the export's remote code), on a tiny trained RNN: same translation, same
   alignment, one decoder step picked.

Each test keeps a screenshot in ``$ATTN_SEQ2SEQ_ARTIFACTS`` (default
``<tmp>/attention-seq2seq-artifacts``, outside pytest's rotating tmp folders; replaced by the next
run) and prints its path. The browser runs with
networking features off; Gradio runs without analytics or share link (explorer_app.launch).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import build_tiny_run, read_pairs, tiny_tokenizer, training_batches

from attention_seq2seq.translation.loading import load_for_inference

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SOURCE = "Y dijo Dios: Sea la luz."


def _artifact(name: str) -> Path:
    import tempfile

    folder = Path(
        os.environ.get("ATTN_SEQ2SEQ_ARTIFACTS") or Path(tempfile.gettempdir()) / "attention-seq2seq-artifacts"
    )
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_env() -> dict:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        GRADIO_ANALYTICS_ENABLED="False",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONUNBUFFERED="1",
    )
    return env


class Server:
    """A subprocess serving the app on 127.0.0.1:port; waits until the page answers."""

    def __init__(self, command: list[str], port: int, log: Path):
        self.port, self.log = port, log
        self.handle = open(log, "w")
        self.process = subprocess.Popen(command, stdout=self.handle, stderr=subprocess.STDOUT, env=_server_env())
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"the app exited with {self.process.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        self.stop()
        pytest.fail(f"the app did not answer on port {port} within 180 s:\n{log.read_text()[-3000:]}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.handle.close()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), f"{CHROMIUM} not found: install Debian's chromium (scripts/install.sh)"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        yield browser
        browser.close()


def two_layer_transformer_run(root: Path) -> Path:
    """A 2-layer, 2-head Transformer trained 60 steps on the tiny corpus slice (tests/helpers.py)."""
    from transformers import AutoModelForSeq2SeqLM

    from attention_seq2seq import TransformerSeq2SeqConfig

    torch.manual_seed(0)
    tokenizer = tiny_tokenizer(root)
    config = TransformerSeq2SeqConfig(
        vocab_size=len(tokenizer),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        dropout=0.0,
        max_position_embeddings=128,
    )
    model = AutoModelForSeq2SeqLM.from_config(config)
    model.generation_config.max_new_tokens = 16
    model.generation_config.num_beams = 2
    batches = list(training_batches(tokenizer, read_pairs(300), batch_size=20))
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    model.train()
    for step in range(60):
        model(**batches[step % len(batches)]).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    run = root / "run-transformer-2-layers"
    model.save_pretrained(run / "model")
    tokenizer.save_pretrained(run / "model")
    return run


def _generate(loaded, **kwargs) -> str:
    encoded = loaded.tokenizer([SOURCE], return_tensors="pt")
    with torch.no_grad():
        out = loaded.model.generate(**encoded, do_sample=False, **kwargs)
    return loaded.tokenizer.decode(out[0], skip_special_tokens=True).strip()


def _attentions(loaded, translation_tokens: list[str]):
    encoded = loaded.tokenizer([SOURCE], return_tensors="pt")
    labels = torch.tensor([loaded.tokenizer.convert_tokens_to_ids(translation_tokens)])
    with torch.no_grad():
        return loaded.model(**encoded, labels=labels, output_attentions=True)


# The app numbers its translations (``data-run`` under the candidates): a new number means this
# click's result is shown, whatever the text (a tiny model may translate into spaces only).
_LAST_RUN = "Math.max(-1, ...Array.from(document.querySelectorAll('#candidates [data-run]'), e => +e.dataset.run))"


def _translate(page, mode: str, expect_rows: int | None = None):
    before = page.evaluate(_LAST_RUN)
    page.locator("#mode").get_by_text(mode, exact=True).click()
    page.locator("#translate").click()
    rows = f" && document.querySelectorAll('#candidates tr').length === {expect_rows + 1}" if expect_rows else ""
    page.wait_for_function(
        f"{_LAST_RUN} > {before} && document.querySelector('#heatmap table.attn-map')" + rows,
        timeout=60000,
    )
    return page.locator("#translation textarea").input_value()


def _shown(page, title_part: str) -> tuple[np.ndarray, list[str], list[str], str]:
    """Wait until the heat-map's title contains ``title_part``; return its array, labels and title."""
    page.wait_for_function(
        f"(document.querySelector('#heatmap .attn-title') || {{}}).textContent?.includes({json.dumps(title_part)})",
        timeout=30000,
    )
    table = page.locator("#heatmap table.attn-map")
    weights = np.array(json.loads(table.get_attribute("data-weights")))
    rows, cols = json.loads(table.get_attribute("data-rows")), json.loads(table.get_attribute("data-cols"))
    return weights, rows, cols, page.locator("#heatmap .attn-title").inner_text()


def _pick(page, picker: str, value: str):
    page.locator(f"#{picker}").get_by_text(value, exact=True).click()


def test_demo_in_chromium_shows_generates_translation_and_the_models_attention(tmp_path, browser):
    run = two_layer_transformer_run(tmp_path)
    loaded = load_for_inference(run, device="cpu", attn_implementation="eager")
    port = _free_port()
    server = Server(
        [sys.executable, "-m", "attention_seq2seq.cli", "demo", "-m", str(run), "--port", str(port)],
        port,
        tmp_path / "demo.log",
    )
    try:
        page = browser.new_page(viewport={"width": 1100, "height": 1300})
        page.goto(server.url, wait_until="load")
        page.wait_for_selector("#translate", timeout=60000)
        page.locator("#source textarea").fill(SOURCE)

        # Greedy: the translation is generate's; the map is the last layer's mean over heads.
        translation = _translate(page, "greedy")
        assert translation == _generate(loaded, num_beams=1)
        weights, rows, cols, _ = _shown(page, "layer 2 of 2, mean over heads")
        expected = _attentions(loaded, rows)
        assert cols == loaded.tokenizer.convert_ids_to_tokens(loaded.tokenizer([SOURCE])["input_ids"][0])
        np.testing.assert_allclose(weights, expected.cross_attentions[1][0].mean(0).numpy(), atol=1e-5)

        # Heads and layers: each map is that head's output_attentions, and the head changes it.
        _pick(page, "head", "1")
        head_1, *_ = _shown(page, "layer 2 of 2, head 1")
        np.testing.assert_allclose(head_1, expected.cross_attentions[1][0, 0].numpy(), atol=1e-5)
        _pick(page, "head", "2")
        head_2, *_ = _shown(page, "layer 2 of 2, head 2")
        np.testing.assert_allclose(head_2, expected.cross_attentions[1][0, 1].numpy(), atol=1e-5)
        assert np.abs(head_1 - head_2).max() > 1e-3
        _pick(page, "layer", "1")
        layer_1, *_ = _shown(page, "layer 1 of 2, head 2")
        np.testing.assert_allclose(layer_1, expected.cross_attentions[0][0, 1].numpy(), atol=1e-5)
        _pick(page, "view", "encoder self-attention")
        # The view resets the layer to the last one and keeps the head: wait for that map first,
        # as a user sees it before the next pick.
        _shown(page, "encoder self-attention, layer 2 of 2, head 2")
        _pick(page, "head", "1")
        encoder, *_ = _shown(page, "encoder self-attention, layer 2 of 2, head 1")
        np.testing.assert_allclose(encoder, expected.encoder_attentions[1][0, 0].numpy(), atol=1e-5)
        _pick(page, "view", "cross-attention")

        # Beam search, beam size 3, length penalty 1: generate's best hypothesis, 3 candidates.
        page.locator("#beams input[type=number]").fill("3")
        page.locator("#beams input[type=number]").press("Enter")
        translation = _translate(page, "beam search", expect_rows=3)
        assert translation == _generate(loaded, num_beams=3, length_penalty=1.0)
        first = page.locator("#candidates td.candidate").first.inner_text()
        assert first == translation

        screenshot = _artifact("explorer-transformer.png")
        page.screenshot(path=str(screenshot), full_page=True)
        print(f"\nscreenshot: {screenshot}")
        assert screenshot.stat().st_size > 10_000
    finally:
        server.stop()


_APP_WITHOUT_PACKAGE = (
    "import runpy, sys; sys.modules['attention_seq2seq'] = None; folder = sys.argv[1]; sys.path.insert(0, folder); "
    "sys.argv = ['app.py', '--port', sys.argv[2], '--host', '127.0.0.1']; "
    "runpy.run_path(folder + '/app.py', run_name='__main__')"
)


def test_space_app_without_the_package_in_chromium(tmp_path, browser):
    from attention_seq2seq.hub.export import export_model

    run = build_tiny_run("rnn_seq2seq", tmp_path)
    folder = export_model(run, tmp_path / "space", space=True)
    loaded = load_for_inference(run, device="cpu", attn_implementation="eager")
    port = _free_port()
    server = Server([sys.executable, "-c", _APP_WITHOUT_PACKAGE, str(folder), str(port)], port, tmp_path / "space.log")
    try:
        page = browser.new_page(viewport={"width": 1100, "height": 1100})
        page.goto(server.url, wait_until="load")
        page.wait_for_selector("#translate", timeout=60000)
        assert not page.locator("#head").is_visible()  # one head: no head picker for the RNN
        page.locator("#source textarea").fill(SOURCE)
        translation = _translate(page, "greedy")
        assert translation == _generate(loaded, num_beams=1)
        weights, rows, _, _ = _shown(page, "cross-attention")
        expected = _attentions(loaded, rows).cross_attentions[0][0, 0].numpy()
        np.testing.assert_allclose(weights, expected, atol=1e-5)

        # One decoder step: the RNN's attention while predicting the 2nd target token.
        page.locator("#step input").click()
        page.get_by_role("option", name="2", exact=True).click()
        step, step_rows, _, _ = _shown(page, "step 2")
        assert step_rows == [rows[1]]
        np.testing.assert_allclose(step, expected[1:2], atol=1e-5)

        screenshot = _artifact("explorer-space-rnn.png")
        page.screenshot(path=str(screenshot), full_page=True)
        print(f"\nscreenshot: {screenshot}")
    finally:
        server.stop()
    assert "Traceback" not in (tmp_path / "space.log").read_text()
