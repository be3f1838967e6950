"""Data preparation at scale: synthetic corpora of 30k, 300k and 3M pairs, three routes.

Each corpus joins two random training pairs of Multi30k (``../shared/data/multi30k`` when
present, else the committed Bible pairs) into one, so no pair repeats and nothing deduplicates;
validation and test are the corpus's own. Every measurement runs in a fresh process:

``new``      this checkout's trainer (prepared, memory-mapped corpus; data/prepared.py), first run
             with an empty cache, then ``new-2nd``: a second run on the same cache, another output folder.
``old``      the trainer of another checkout (``--old_tree``, the package laid out as installed;
             e.g. the commit before issue 29): Python lists of every pair, no cache.
``peer``     transformers' usual route: ``datasets.map`` with the tokenizer (``num_proc`` workers) and
             ``DataCollatorForSeq2Seq`` batches of 64 sentences, the same tiny model and AdamW; it
             reuses the tokenizer the ``new`` run trained (tokenizer training excluded).

Reported per route: wall seconds from process start to the end of the first update and of the
20th, preparation seconds and pairs/s (read + clean + tokenize, tokenizer training excluded, from
the run's log), tokenizer-training seconds, and the process's peak RSS (``ru_maxrss``).

    python benchmarks/bench_data.py --sizes 30000 300000 --old_tree /tmp/old
    python benchmarks/bench_data.py --sizes 3000000 --routes new new-2nd

Prints a Markdown table and writes ``benchmarks/results/bench_data.json``. Timings on a shared
machine are disturbed by other work: compare routes measured in the same invocation.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
TINY = {
    "d_model": 64,
    "encoder_layers": 1,
    "decoder_layers": 1,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128,
}
STEPS = 20

# Runs inside the measured process: records when the first and the last update end, and the
# peak RSS, into the JSON file named by BENCH_DATA_OUT. BENCH_DATA_OLD_TREE switches the
# imports to another checkout (the editable install's finder is dropped).
CHILD = r"""
import json, os, resource, runpy, sys, time
out = os.environ["BENCH_DATA_OUT"]
old = os.environ.get("BENCH_DATA_OLD_TREE")
if old:
    sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f)]
    sys.path.insert(0, old)
record = {"updates": []}
def dump():
    record["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with open(out, "w") as f:
        json.dump(record, f)
import attention_seq2seq.training.objectives as objectives
real = objectives.optimizer_update
def timed(*args, **kwargs):
    result = real(*args, **kwargs)
    record["updates"].append(time.time())
    return result
objectives.optimizer_update = timed
sys.argv = ["train"] + sys.argv[1:]
try:
    runpy.run_module("attention_seq2seq.training.train", run_name="__main__", alter_sys=True)
finally:
    dump()
"""

PEER = r"""
import json, os, resource, sys, time
import torch
from transformers import DataCollatorForSeq2Seq, PreTrainedTokenizerFast
from attention_seq2seq.data.corpora import load_corpus
from attention_seq2seq.modeling.registry import BY_NAME
corpus, tokenizer_dir, max_len, num_proc = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
tiny, out = json.loads(sys.argv[5]), os.environ["BENCH_DATA_OUT"]
record = {"updates": []}
start = time.time()
train = load_corpus(corpus)["train"]
tok = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
def encode(batch):
    return tok(batch["source"], text_target=batch["target"], truncation=True, max_length=max_len)
train = train.map(encode, batched=True, num_proc=num_proc, remove_columns=["source", "target"])
record["prepare_s"] = time.time() - start
record["pairs"] = len(train)
family = BY_NAME["transformer"]
torch.manual_seed(0)
model = family.lm_cls()(family.config_cls()(vocab_size=len(tok), pad_token_id=tok.pad_token_id,
                                            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                            decoder_start_token_id=tok.bos_token_id, **tiny))
collator = DataCollatorForSeq2Seq(tok, model=model)
loader = torch.utils.data.DataLoader(train, batch_size=64, shuffle=True, collate_fn=collator)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step, batch in zip(range(20), loader):
    loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    record["updates"].append(time.time())
record["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
json.dump(record, open(out, "w"))
"""


def pairs_source() -> tuple[Path, str, str, dict[str, str]]:
    shared = Path(os.environ.get("ATTN_SEQ2SEQ_SHARED_DATA", REPO.parent / "shared" / "data")) / "multi30k"
    if (shared / "train.en").exists():
        return shared, "de", "en", {"train": "train", "val": "val", "test": "test2016"}
    return REPO / "tests" / "fixtures" / "bible-es-en", "es", "en", {"train": "train", "val": "dev", "test": "test"}


def make_corpus(n: int, folder: Path) -> str:
    """Write ``n`` joined pairs (seeded) plus the source's val/test; returns the corpus spec."""
    root, src, tgt, stems = pairs_source()
    spec = f"text:{folder}:{src}-{tgt}"
    if (folder / f"train.{tgt}").exists():
        return spec
    folder.mkdir(parents=True, exist_ok=True)
    sides = {lang: (root / f"{stems['train']}.{lang}").read_text(encoding="utf-8").splitlines() for lang in (src, tgt)}
    rng = np.random.default_rng(n)
    for lang in (src, tgt):
        (folder / f"val.{lang}").write_text(
            (root / f"{stems['val']}.{lang}").read_text(encoding="utf-8"), encoding="utf-8"
        )
        (folder / f"test.{lang}").write_text(
            (root / f"{stems['test']}.{lang}").read_text(encoding="utf-8"), encoding="utf-8"
        )
    m = len(sides[src])
    chunk = 500_000
    files = {lang: open(folder / f"train.{lang}.tmp", "w", encoding="utf-8") for lang in (src, tgt)}
    for start in range(0, n, chunk):
        k = min(chunk, n - start)
        a, b = rng.integers(0, m, k), rng.integers(0, m, k)
        for lang in (src, tgt):
            lines = sides[lang]
            files[lang].write("".join(f"{lines[i]} {lines[j]}\n" for i, j in zip(a.tolist(), b.tolist())))
    for lang, f in files.items():
        f.close()
        os.replace(folder / f"train.{lang}.tmp", folder / f"train.{lang}")
    return spec


def train_args(spec: str, out: Path) -> list[str]:
    args = [
        "--recipe",
        str(REPO / "training/recipes/multi30k-transformer-small.yaml"),
        "--corpus",
        spec,
        "--output_dir",
        str(out),
        "--max_steps",
        str(STEPS),
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
        "--log_every",
        "10",
        "--vocab_size",
        "8000",
    ]
    for key, value in TINY.items():
        args += [f"--model_config.{key}", str(value)]
    return args


def run_child(code: list[str], env: dict, log: Path) -> dict:
    fd, out = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    env = {
        **os.environ,
        **env,
        "BENCH_DATA_OUT": out,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    start = time.time()
    with open(log, "w") as f:
        proc = subprocess.run([sys.executable, *code], env=env, stdout=f, stderr=subprocess.STDOUT, cwd=REPO)
    text = Path(out).read_text()
    record = json.loads(text) if text else {}
    record["rc"] = proc.returncode
    updates = record.pop("updates", [])
    record["first_update_s"] = round(updates[0] - start, 1) if updates else None
    record["last_update_s"] = round(updates[-1] - start, 1) if updates else None
    record["updates_done"] = len(updates)
    return record


def log_figures(log: Path) -> dict:
    text = log.read_text(errors="replace")
    figures = {}
    if m := re.search(r"read and cleaned .*? in ([\d.]+) s \(([\d.]+) CPU-s\)", text):
        figures["read_clean_s"], figures["read_clean_cpu_s"] = float(m.group(1)), float(m.group(2))
    if m := re.search(
        r"trained a \w+ tokenizer .*? on (\d+) of (\d+) training pairs in ([\d.]+) s \(([\d.]+) CPU-s\)", text
    ):
        figures["tokenizer_pairs"], figures["tokenizer_train_s"] = int(m.group(1)), float(m.group(3))
        figures["tokenizer_train_cpu_s"] = float(m.group(4))
    if m := re.search(
        r"tokenized (\d+) training pairs in ([\d.]+) s \(\d+ pairs/s; ([\d.]+) CPU-s in (\d+) process", text
    ):
        figures["tokenize_s"], figures["tokenize_cpu_s"] = float(m.group(2)), float(m.group(3))
        figures["tokenize_processes"] = int(m.group(4))
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[30_000, 300_000, 3_000_000])
    parser.add_argument(
        "--routes", nargs="+", default=["old", "new", "new-2nd", "peer"], choices=["old", "new", "new-2nd", "peer"]
    )
    parser.add_argument("--old_tree", help="folder with the old checkout's package (attention_seq2seq/...)")
    parser.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "bench_data"))
    parser.add_argument("--num_proc", type=int, default=2, help="peer route: datasets.map workers")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "bench_data.json"))
    a = parser.parse_args()
    work = Path(a.work)
    results = []
    for n in a.sizes:
        spec = make_corpus(n, work / f"corpus-{n}")
        cache = work / f"cache-{n}-{os.getpid()}"
        for route in a.routes:
            if route == "old" and not a.old_tree:
                continue
            out = work / f"run-{n}-{route}-{os.getpid()}"
            log = work / f"log-{n}-{route}-{os.getpid()}.txt"
            if route == "peer":
                tokenizer_dir = work / f"run-{n}-new-{os.getpid()}" / "model"
                record = run_child(
                    ["-c", PEER, spec, str(tokenizer_dir), "64", str(a.num_proc), json.dumps(TINY)], {}, log
                )
            else:
                env = {"ATTENTION_SEQ2SEQ_CACHE": str(cache)}
                if route == "old":
                    env["BENCH_DATA_OLD_TREE"] = a.old_tree
                record = run_child(["-c", CHILD, *train_args(spec, out)], env, log)
                record.update(log_figures(log))
                if "tokenize_s" in record:
                    record["prepare_s"] = round(record.get("read_clean_s", 0) + record["tokenize_s"], 1)
                    # load-independent: what 2 idle cores would take (read+clean is one process)
                    cpu = record.get("read_clean_cpu_s", 0) + record["tokenize_cpu_s"] / min(
                        2, record["tokenize_processes"]
                    )
                    record["prepare_2core_s"] = round(cpu, 1)
                    record["pairs_per_s_2core"] = round(n / cpu) if cpu else None
            if record.get("prepare_s"):
                record["pairs_per_s"] = round(n / record["prepare_s"])
            record.update(pairs=n, route=route)
            results.append(record)
            print(json.dumps(record), flush=True)
    print(table(results))
    meta = {"host": platform.node(), "cpu": _cpu_name(), "cores": os.cpu_count(), "python": platform.python_version()}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    return 0


def table(results: list[dict]) -> str:
    """The Markdown table of the records (wall seconds from process start; '2 cores': from CPU seconds)."""
    rows = [
        "| pairs | route | first update (s) | 20th update (s) | prepare (s) | pairs/s "
        "| prepare on 2 idle cores (s, from CPU time) "
        "| pairs/s on 2 cores | tokenizer training (s) | peak RSS (MB) |",
        "|" + "---:|" * 10,
    ]
    for r in results:
        prep = r.get("prepare_s")
        rows.append(
            f"| {r['pairs']:,} | {r['route']} | {r.get('first_update_s')} | {r.get('last_update_s')} "
            f"| {'' if prep is None else round(prep, 1)} | {r.get('pairs_per_s', '')} | {r.get('prepare_2core_s', '')} "
            f"| {r.get('pairs_per_s_2core', '')} | {r.get('tokenizer_train_s', '')} | {r.get('peak_rss_mb', 0):.0f} |"
        )
    return "\n".join(rows)


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    sys.exit(main())
