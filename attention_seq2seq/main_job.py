"""The main job, end to end: built-in Bible corpus -> two trained models -> Hub-ready exports.

This is the README's first command (``bash scripts/main_job.sh`` installs, then runs this module).
It does what a user of the package does, with the package's own commands:

1. reads the built-in offline corpus (Spanish RV1909 -> English WEB, Debian's SWORD modules);
2. trains a Luong-attention RNN and a Transformer-small with Accelerate
   (``accelerate launch --cpu -m attention_seq2seq.training.train --recipe ...``), each for a fixed
   number of updates (a slower or busier machine takes longer and gets the same model), in bf16
   or float32 as the CPU's declared features decide (``mixed_precision: auto``), and scores each
   on the held-out test chapters (BLEU, chrF, signature);
3. exports both as Hub-ready folders (``attention-seq2seq export``): safetensors, remote code,
   model card, attention heat-map;
4. loads each export as a Hub user would, in a fresh Python process where this package cannot be
   imported: ``pipeline("translation", model=<folder>, trust_remote_code=True)``, and translates
   sentences that are not in the corpus;
5. prints a results table and writes it to ``<output_dir>/summary.json`` and ``summary.md``.

Usage::

    python -m attention_seq2seq.main_job [--output-dir runs/main-job]
    python -m attention_seq2seq.main_job --quick    # a 2-minute smoke version (the CI test)
    python -m attention_seq2seq.main_job --minutes 5  # opt-in: a wall-clock budget per model

Before training, the job prints the work it will do (updates per model) and the precision each
model trains in; each model shows a progress bar with its ETA; the table at the end gives the
measured times. ``--minutes N`` trades that for a wall-clock budget: each model trains for N
minutes with its learning rate annealed to 0 at the end of them, so the result then depends on
the machine's speed and load.
"""

from __future__ import annotations

import argparse
import codecs
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import training as training_package
from .translation.scores import format_score

RECIPES = Path(training_package.__file__).resolve().parent / "recipes"  # attention_seq2seq/training/recipes

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
    "bible-rnn-luong": "--model_config.hidden_size 64 --model_config.embedding_size 64".split(),
    "bible-transformer-small": (
        "--model_config.d_model 64 --model_config.encoder_ffn_dim 128 --model_config.decoder_ffn_dim 128 "
        "--model_config.encoder_attention_heads 4 --model_config.decoder_attention_heads 4"
    ).split(),
}
QUICK_COMMON = (
    "--max_train_samples 3000 --vocab_size 2000 --max_steps 60 --warmup_steps 20 --max_eval_samples 20 "
    "--max_test_samples 40 --eval_num_beams 2 --test_num_beams 2 --save_every 1000 --max_tokens 2048 "
    # Untrained models rarely emit </s>: a short generation limit keeps their evaluation quick.
    "--max_source_length 48 --max_target_length 24"
).split()

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


def _relay(proc: subprocess.Popen, log, live: bool) -> None:
    """Copy a child's output to the terminal and to ``log``.

    A progress bar redraws itself with carriage returns. ``live`` (our stdout is a terminal):
    the bytes go to the terminal as they come, so the bar moves in place; otherwise each redraw
    becomes a line of its own. The log file gets whole lines, a bar only in its last state.
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    fd = proc.stdout.fileno()
    pending = ""
    while True:
        chunk = os.read(fd, 65536)
        text = decoder.decode(chunk, final=not chunk)
        if live and text:
            sys.stdout.write(text)
            sys.stdout.flush()
        pending += text
        if not chunk and pending:  # the child's last line, without its newline
            pending += "\n"
        *lines, pending = pending.split("\n")
        for line in lines:
            redraws = [part for part in line.split("\r") if part.strip()]
            if redraws:
                log.write(redraws[-1] + "\n")
            if not live:
                for part in redraws:
                    sys.stdout.write(part + "\n")
        if not live:  # a bar redraws without ending its line: show each finished redraw now
            *redraws, pending = pending.split("\r")
            for part in redraws:
                if part.strip():
                    sys.stdout.write(part + "\n")
            sys.stdout.flush()
        if not chunk:
            return


def _run(cmd: list[str], log: Path | None = None, env: dict | None = None, show: str | None = None) -> str:
    """Run a command, echoing it (or ``show`` in its place); stream its output to ``log`` (and
    the terminal), or return it when there is no log. Raises SystemExit on failure."""
    print("$ " + (show or " ".join(cmd)), flush=True)
    if log is None:
        done = subprocess.run(cmd, env=env, text=True, capture_output=True)
        if done.returncode != 0:
            sys.stderr.write(done.stdout + done.stderr)
            raise SystemExit(f"main job: command failed with exit code {done.returncode}: {show or ' '.join(cmd)}")
        return done.stdout
    log.parent.mkdir(parents=True, exist_ok=True)
    live = sys.stdout.isatty()
    env = dict(env if env is not None else os.environ)
    if live:  # the training bar redraws twice a second at the terminal's width
        size = shutil.get_terminal_size()
        env.update({"ATTENTION_SEQ2SEQ_PROGRESS": "live", "COLUMNS": str(size.columns), "LINES": str(size.lines)})
    with open(log, "w", encoding="utf-8") as handle:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        _relay(proc, handle, live)
        code = proc.wait()
    if code != 0:
        raise SystemExit(f"main job: command failed with exit code {code} (log: {log}): {' '.join(cmd)}")
    return ""


def _child_env() -> dict:
    """The environment of the job's commands: offline, and without the hints that libraries
    print for every process (Accelerate's OMP_NUM_THREADS notice, tokenizers' fork warning)."""
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    # torch's default intra-op threads (one per core), said explicitly: accelerate launch --cpu
    # otherwise prints a hint about it and may pick a different count.
    env.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    return env


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
        out = _run(
            [sys.executable, "-c", _HUB_USER_SCRIPT, str(export_dir), json.dumps(list(sentences))],
            env=env,
            show=f'pipeline("translation", model="{export_dir}", trust_remote_code=True) in a fresh Python process '
            "where attention_seq2seq cannot be imported",
        )
    return json.loads(out.strip().splitlines()[-1])


def train_arguments(name: str, recipe: Path, quick: bool, minutes: float | None) -> list[str]:
    """The recipe and the overrides that the job passes to the training script for ``name``."""
    args = ["--recipe", str(recipe)]
    if quick:
        args += QUICK_COMMON + QUICK_OVERRIDES[name]
    if minutes is not None:  # opt-in wall-clock budget: the lr anneals to 0 when the minutes run out
        args += ["--max_steps", "null", "--schedule", "linear_time", "--max_time_minutes", str(minutes)]
    return args


def plan(name: str, recipe: Path, quick: bool, minutes: float | None) -> dict:
    """The work of one model (its updates, batch size and precision), before any training."""
    from .training.config import parse_command_line
    from .training.train import TrainConfig, resolve_precision

    config = parse_command_line(TrainConfig, train_arguments(name, recipe, quick, minutes))
    choice = resolve_precision(config)
    return {
        "updates": config.max_steps,
        "max_tokens": config.max_tokens,
        "mixed_precision": choice.mixed_precision if choice is not None else config.mixed_precision,
        "precision_reason": choice.reason if choice is not None else "set by the recipe",
    }


def summarize(name: str, run_dir: Path, export_dir: Path, translations: list[str], work: dict, timings: dict) -> dict:
    metrics = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
    test_name, test = next(iter(metrics["test"].items()))
    train = metrics.get("train", {})
    return {
        "model": name,
        "export": str(export_dir),
        "budget_minutes": work.get("budget_minutes"),
        "steps": train.get("steps"),
        "mixed_precision": train.get("mixed_precision"),
        "train_wall_time_s": train.get("wall_time_s"),
        "job_wall_time_s": timings,  # seconds of each stage of this model: train (incl. data and test), export, load
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
    header = "| model | updates | precision | train time | target tok/s | test set (sentences) | BLEU | chrF |"
    lines = [header, "|---|---:|---|---:|---:|---|---:|---:|"]
    for r in rows:
        precision = {"bf16": "bf16", "no": "float32"}.get(r.get("mixed_precision"), r.get("mixed_precision"))
        lines.append(
            f"| {r['model']} | {r['steps']} | {precision} | {r['train_wall_time_s']:.0f} s | "
            f"{r['target_tokens_per_s']:.0f} | "
            f"{r['test_set']} ({r['test_sentences']}) | {format_score(r, 'bleu', 1)} | {format_score(r, 'chrf', 1)} |"
        )
    lines += [
        "",
        f"BLEU signature: `{rows[0]['bleu_signature']}`; chrF signature: `{rows[0]['chrf_signature']}`",
        "",
        "Translations of sentences that are not in the corpus "
        "(exports loaded with pipeline(..., trust_remote_code=True)):",
        "",
    ]
    for sentence in NEW_SENTENCES:
        lines.append(f"- es: {sentence}")
        for r in rows:
            lines.append(f"  - {r['model']}: {r['translations'][sentence]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attention_seq2seq.main_job",
        description=(
            "Train, evaluate, export and load a Luong RNN and a Transformer-small on the built-in Bible corpus."
        ),
    )
    parser.add_argument("--output-dir", type=Path, default=Path("runs/main-job"), help="runs and exports go here")
    parser.add_argument(
        "--minutes",
        type=float,
        default=None,
        help="opt-in: train each model for N minutes (lr annealed to 0 at the end) instead of the recipes' "
        "fixed number of updates; the result then depends on this machine's speed and load",
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny models and data: a ~2-minute smoke test of the whole job"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace the runs and exports of a previous job")
    args = parser.parse_args(argv)
    if args.minutes is not None and not args.minutes > 0:
        parser.error(f"--minutes must be > 0; got {args.minutes:g}")
    import datasets

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    datasets.disable_progress_bars()  # no per-split bars from the corpus check in this process

    start = time.time()
    out = args.output_dir
    if out.exists() and any(out.iterdir()):
        if not args.overwrite:
            parser.error(f"--output-dir {out} is not empty; pass --overwrite to replace the previous job's runs")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)

    print("== 1/5 corpus: built-in Bible, Spanish RV1909 -> English WEB (Debian SWORD modules)", flush=True)
    n_sources = check_sentences_are_new(NEW_SENTENCES)
    print(f"   {n_sources} distinct source verses; the demo sentences are not among them", flush=True)

    print("== 2/5 the work", flush=True)
    works = {}
    for name, recipe in MODELS:
        work = works[name] = {**plan(name, recipe, args.quick, args.minutes), "budget_minutes": args.minutes}
        precision = {"bf16": "bf16", "no": "float32"}.get(work["mixed_precision"], work["mixed_precision"])
        if args.minutes is not None:
            amount = (
                f"{args.minutes:g} minutes (opt-in wall-clock budget: the number of updates depends on this machine)"
            )
        else:
            amount = f"{work['updates']} updates of <= {work['max_tokens']} tokens"
        print(f"   {name}: {amount}; {precision}: {work['precision_reason']}", flush=True)

    rows = []
    for name, recipe in MODELS:
        run_dir, export_dir = out / "runs" / name, out / "exports" / name
        timings = {}
        print(f"== 3/5 train and test {name} with Accelerate ({recipe.name})", flush=True)
        launch = "launch --cpu --num_processes 1 --num_machines 1 --mixed_precision no --dynamo_backend no"
        cmd = [_bin("accelerate"), *launch.split(), "-m", "attention_seq2seq.training.train"]
        cmd += [*train_arguments(name, recipe, args.quick, args.minutes), "--output_dir", str(run_dir)]
        cmd += ["--log_with", "none"]
        stage = time.time()
        _run(cmd, log=out / "logs" / f"train-{name}.log", env=_child_env())
        timings["train_and_test_s"] = round(time.time() - stage, 1)

        print(f"== 4/5 export {name} -> {export_dir}", flush=True)
        stage = time.time()
        _run([_bin("attention-seq2seq"), "export", str(run_dir), "-o", str(export_dir)], env=_child_env())
        timings["export_s"] = round(time.time() - stage, 1)

        print(f"== 5/5 load the export as a Hub user and translate new sentences ({name})", flush=True)
        stage = time.time()
        translations = translate_as_hub_user(export_dir, NEW_SENTENCES)
        timings["load_and_translate_s"] = round(time.time() - stage, 1)
        rows.append(summarize(name, run_dir, export_dir, translations, works[name], timings))
        print(
            f"   {name}: {rows[-1]['steps']} updates, trained in {rows[-1]['train_wall_time_s'] / 60:.1f} min; "
            f"test BLEU {format_score(rows[-1], 'bleu', 1)}, chrF {format_score(rows[-1], 'chrf', 1)}",
            flush=True,
        )

    table = results_table(rows)
    total = time.time() - start
    summary = {"total_wall_time_s": round(total, 1), "models": rows}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "summary.md").write_text(table + "\n", encoding="utf-8")
    print("\n" + table)
    print(f"\nmain job done in {total / 60:.1f} min (measured)")
    print(f"  exports (Hub-ready folders): {out / 'exports'}")
    print(f"  runs (metrics.json, test translations, attention plots, checkpoints): {out / 'runs'}")
    print(f"  summary: {out / 'summary.md'} and {out / 'summary.json'}; logs: {out / 'logs'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
