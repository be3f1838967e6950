"""Same seed, same recipe, old data path vs new: identical per-update losses and batch ids?

Trains a recipe (default: multi30k-transformer-small with a tiny model) for N updates twice,
once with the code of another checkout (``--old_tree``: a folder laid out as the installed package,
``attention_seq2seq/`` with the source folders linked in) and once with this checkout, both with
``log_every 1`` and ``debug_dump_batches``, then compares ``metrics.json``'s loss history and the
dumped batch ids. Prints one JSON line; exit status 1 when they differ.

    python benchmarks/compare_data_paths.py --old_tree /tmp/i29-old --steps 200
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TINY = [
    "--model_config.d_model",
    "64",
    "--model_config.encoder_layers",
    "1",
    "--model_config.decoder_layers",
    "1",
    "--model_config.encoder_attention_heads",
    "4",
    "--model_config.decoder_attention_heads",
    "4",
    "--model_config.encoder_ffn_dim",
    "128",
    "--model_config.decoder_ffn_dim",
    "128",
]

OLD_RUNNER = (
    "import runpy, sys; sys.meta_path = [f for f in sys.meta_path if 'editable' not in repr(f)]; "
    "sys.path.insert(0, sys.argv.pop(1)); sys.argv[0] = 'train'; "
    "runpy.run_module('attention_seq2seq.training.train', run_name='__main__', alter_sys=True)"
)


def run(python_args: list[str], out: Path, recipe: str, steps: int, extra: list[str]) -> float:
    args = [
        *python_args,
        "--recipe",
        recipe,
        "--max_steps",
        str(steps),
        "--output_dir",
        str(out),
        "--log_every",
        "1",
        "--debug_dump_batches",
        "true",
        "--eval_every",
        "100000",
        "--eval_max_examples",
        "10",
        "--eval_num_beams",
        "1",
        "--test_max_examples",
        "10",
        "--test_num_beams",
        "1",
        "--num_plot_sentences",
        "0",
        "--log_with",
        "none",
        "--save_every",
        "100000",
        "--num_threads",
        "1",
        "--vocab_size",
        "2000",
        *TINY,
        *extra,
    ]
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old_tree", required=True)
    parser.add_argument("--recipe", default="training/recipes/multi30k-transformer-small.yaml")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--real_model", action="store_true", help="the recipe's own model, not the tiny one")
    parser.add_argument("extra", nargs="*", help="more overrides for both runs")
    a = parser.parse_args()
    if a.real_model:
        TINY.clear()
    work = Path(tempfile.mkdtemp(prefix="compare_data_paths_"))
    old_s = run(["-c", OLD_RUNNER, a.old_tree], work / "old", a.recipe, a.steps, a.extra)
    new_s = run(["-m", "attention_seq2seq.training.train"], work / "new", a.recipe, a.steps, a.extra)
    metrics = {k: json.loads((work / k / "metrics.json").read_text())["train"] for k in ("old", "new")}
    losses = {k: [v for _, v in m["loss_history"]] for k, m in metrics.items()}
    batches = {k: (work / k / "debug" / "batches_rank0.jsonl").read_text() for k in ("old", "new")}
    result = {
        "steps": a.steps,
        "losses_logged": len(losses["new"]),
        "identical_losses": losses["old"] == losses["new"],
        "identical_batches": batches["old"] == batches["new"],
        "first_loss": losses["new"][:1],
        "last_loss": losses["new"][-1:],
        "old_wall_s": round(old_s, 1),
        "new_wall_s": round(new_s, 1),
        "target_tokens_per_s": {k: round(m["target_tokens_per_s"]) for k, m in metrics.items()},
        "train_time_s": {k: round(m["train_time_s"], 1) for k, m in metrics.items()},
        "dir": str(work),
    }
    print(json.dumps(result))
    return 0 if result["identical_losses"] and result["identical_batches"] else 1


if __name__ == "__main__":
    sys.exit(main())
