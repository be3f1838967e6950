"""The main job, end to end: built-in Bible corpus -> two trained models -> Hub-ready exports.

This is the README's first command (``bash scripts/main_job.sh`` installs, then runs this module).
It does what a user of the package does, with the package's own commands:

1. reads the built-in offline corpus (Spanish RV1909 -> English WEB, Debian's SWORD modules);
2. trains a Luong-attention RNN and a Transformer-small with Accelerate
   (``accelerate launch --cpu -m attention_seq2seq.training.train --recipe ...``), each for a fixed
   wall-clock budget, and scores each on the held-out test chapters (BLEU, chrF, signature);
3. exports both as Hub-ready folders (``attention-seq2seq export``): safetensors, remote code,
   model card, attention heat-map;
4. loads each export as a Hub user would, in a fresh Python process where this package cannot be
   imported: ``pipeline("translation", model=<folder>, trust_remote_code=True)``, and translates
   sentences that are not in the corpus;
5. prints a results table and writes it to ``<output_dir>/summary.json`` and ``summary.md``.

Usage::

    python -m attention_seq2seq.training.main_job [--output-dir runs/main-job] [--minutes 5]
    python -m attention_seq2seq.training.main_job --quick    # a 2-minute smoke version (the CI test)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .metrics import format_score

RECIPES = Path(__file__).resolve().parent / "recipes"

#: (name, recipe) of the two models the job trains.
MODELS = (
    ("bible-rnn-luong", RECIPES / "main-job-bible-rnn-luong.yaml"),
    ("bible-transformer-small", RECIPES / "main-job-bible-transformer-small.yaml"),
)

#: Spanish sentences written for this demo, not taken from the corpus (checked at run time).
NEW_SENTENCES = (
    "El hombre dijo a su hermano que fuera a la ciudad.",
    "Los niños comieron pan y bebieron agua en la casa de su padre.",
    "Y el rey envió mensajeros a todo el pueblo.",
)

#: Overrides of the --quick smoke version: a tiny model and corpus slice, so the whole job runs in
#: about two minutes on 2 CPU cores. It proves the plumbing, not the quality.
QUICK_OVERRIDES = {
    "bible-rnn-luong": ["--model_config.hidden_size", "64", "--model_config.embedding_size", "64"],
    "bible-transformer-small": [
        "--model_config.d_model", "64", "--model_config.encoder_ffn_dim", "128",
        "--model_config.decoder_ffn_dim", "128", "--model_config.encoder_attention_heads", "4",
        "--model_config.decoder_attention_heads", "4", "--warmup_steps", "20",
    ],
}
QUICK_COMMON = [
    "--max_train_examples", "3000", "--vocab_size", "2000", "--max_time_minutes", "0.4",
    "--eval_max_examples", "20", "--test_max_examples", "40", "--eval_num_beams", "2",
    "--test_num_beams", "2", "--save_every", "1000", "--max_tokens", "2048",
    # Untrained models rarely emit </s>: a short generation limit keeps their evaluation quick.
    "--max_source_length", "48", "--max_target_length", "24",
]

# Runs in a fresh interpreter: our package is made unimportable before transformers is imported,
# so the export must stand on its own shipped code, as it will on the Hub.
_HUB_USER_SCRIPT = r"""
import json, sys
sys.modules["attention_seq2seq"] = None
from transformers import pipeline
folder, sentences = sys.argv[1], json.loads(sys.argv[2])
translator = pipeline("translation", model=folder, trust_remote_code=True)
out = translator(sentences, num_beams=5, max_new_tokens=64, batch_size=8)
print(json.dumps([o["translation_text"] for o in out], ensure_ascii=False))
"""


def _run(cmd: list[str], log: Path | None = None, env: dict | None = None) -> str:
    """Run a command, echoing it; stream its output to ``log`` (and the terminal). Raises on failure."""
    print("$ " + " ".join(cmd), flush=True)
    if log is None:
        done = subprocess.run(cmd, env=env, text=True, capture_output=True)
        if done.returncode != 0:
            sys.stderr.write(done.stdout + done.stderr)
            raise SystemExit(f"main job: command failed with exit code {done.returncode}: {' '.join(cmd)}")
        return done.stdout
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w", encoding="utf-8") as handle:
        proc = subprocess.Popen(cmd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert proc.stdout is not None
        for line in proc.stdout:
            handle.write(line)
            if not line.startswith("\r"):
                sys.stdout.write(line)
        code = proc.wait()
    if code != 0:
        raise SystemExit(f"main job: command failed with exit code {code} (log: {log}): {' '.join(cmd)}")
    return ""


def _bin(name: str) -> str:
    """A console script of this interpreter's environment (``accelerate``, ``attention-seq2seq``)."""
    candidate = Path(sys.executable).with_name(name)
    return str(candidate) if candidate.exists() else name


def check_sentences_are_new(sentences: tuple[str, ...]) -> int:
    """Return the size of the corpus searched; raise if a demo sentence occurs in it."""
    from attention_seq2seq.data import load_corpus

    corpus = load_corpus("bible:es-en")
    seen = set()
    for split in corpus.values():
        seen.update(split["source"])
    for sentence in sentences:
        if sentence in seen:
            raise SystemExit(f"main job: demo sentence occurs in the corpus: {sentence!r}")
    return len(seen)


def translate_as_hub_user(export_dir: Path, sentences: tuple[str, ...]) -> list[str]:
    """Translate with ``pipeline("translation", trust_remote_code=True)`` in a clean process."""
    with tempfile.TemporaryDirectory() as modules_cache:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": modules_cache}
        out = _run([sys.executable, "-c", _HUB_USER_SCRIPT, str(export_dir), json.dumps(list(sentences))], env=env)
    return json.loads(out.strip().splitlines()[-1])


def summarize(name: str, run_dir: Path, export_dir: Path, translations: list[str], minutes: float) -> dict:
    metrics = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
    test_name, test = next(iter(metrics["test"].items()))
    train = metrics.get("train", {})
    return {
        "model": name,
        "export": str(export_dir),
        "budget_minutes": minutes,
        "steps": train.get("steps"),
        "train_wall_time_s": train.get("wall_time_s"),
        "target_tokens_per_s": train.get("target_tokens_per_s"),
        "test_set": test_name,
        "test_sentences": test.get("num_sentences"),
        "num_beams": test.get("num_beams"),
        "bleu": test.get("bleu"),
        "chrf": test.get("chrf"),
        # 95% bootstrap half-widths, present when the recipe sets test_bootstrap (all of ours do)
        "bleu_ci95": test.get("bleu_ci95"),
        "chrf_ci95": test.get("chrf_ci95"),
        "bleu_signature": test.get("bleu_signature"),
        "chrf_signature": test.get("chrf_signature"),
        "translations": dict(zip(NEW_SENTENCES, translations)),
    }


def results_table(rows: list[dict]) -> str:
    header = "| model | steps | train time | target tok/s | test set (sentences) | BLEU | chrF |"
    lines = [header, "|---|---:|---:|---:|---|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['steps']} | {r['train_wall_time_s']:.0f} s | {r['target_tokens_per_s']:.0f} | "
            f"{r['test_set']} ({r['test_sentences']}) | {format_score(r, 'bleu', 1)} | {format_score(r, 'chrf', 1)} |"
        )
    lines.append("")
    lines.append(f"BLEU signature: `{rows[0]['bleu_signature']}`; chrF signature: `{rows[0]['chrf_signature']}`")
    lines.append("")
    lines.append("Translations of sentences that are not in the corpus (exports loaded with pipeline(..., trust_remote_code=True)):")
    lines.append("")
    for sentence in NEW_SENTENCES:
        lines.append(f"- es: {sentence}")
        for r in rows:
            lines.append(f"  - {r['model']}: {r['translations'][sentence]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attention_seq2seq.training.main_job",
        description="Train, evaluate, export and load a Luong RNN and a Transformer-small on the built-in Bible corpus.",
    )
    parser.add_argument("--output-dir", type=Path, default=Path("runs/main-job"), help="runs and exports go here")
    parser.add_argument("--minutes", type=float, default=5.0, help="training budget of each model (default: 5)")
    parser.add_argument("--quick", action="store_true", help="tiny models and data: a ~2-minute smoke test of the whole job")
    parser.add_argument("--overwrite", action="store_true", help="replace the runs and exports of a previous job")
    args = parser.parse_args(argv)

    start = time.time()
    out = args.output_dir
    if out.exists() and any(out.iterdir()):
        if not args.overwrite:
            parser.error(f"--output-dir {out} is not empty; pass --overwrite to replace the previous job's runs")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)

    print("== 1/4 corpus: built-in Bible, Spanish RV1909 -> English WEB (Debian SWORD modules)", flush=True)
    n_sources = check_sentences_are_new(NEW_SENTENCES)
    print(f"   {n_sources} distinct source verses; the demo sentences are not among them", flush=True)

    rows = []
    for name, recipe in MODELS:
        run_dir, export_dir = out / "runs" / name, out / "exports" / name
        minutes = 0.4 if args.quick else args.minutes
        print(f"== 2/4 train {name} for {minutes:g} min with Accelerate ({recipe.name})", flush=True)
        cmd = [
            _bin("accelerate"), "launch", "--cpu", "--num_processes", "1", "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no",
            "-m", "attention_seq2seq.training.train", "--recipe", str(recipe),
            "--output_dir", str(run_dir), "--max_time_minutes", str(minutes), "--log_with", "none",
        ]
        if args.quick:
            cmd += QUICK_COMMON + QUICK_OVERRIDES[name]
        _run(cmd, log=out / "logs" / f"train-{name}.log")

        print(f"== 3/4 export {name} -> {export_dir}", flush=True)
        _run([_bin("attention-seq2seq"), "export", str(run_dir), "-o", str(export_dir)])

        print(f"== 4/4 load the export as a Hub user and translate new sentences ({name})", flush=True)
        translations = translate_as_hub_user(export_dir, NEW_SENTENCES)
        rows.append(summarize(name, run_dir, export_dir, translations, minutes))

    table = results_table(rows)
    total = time.time() - start
    summary = {"total_wall_time_s": round(total, 1), "models": rows}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "summary.md").write_text(table + "\n", encoding="utf-8")
    print("\n" + table)
    print(f"\nmain job done in {total / 60:.1f} min; exports in {out / 'exports'}; summary in {out / 'summary.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
