"""The benchmark stages: one table that both drivers read.

- `benchmarks/run_all.py` runs the stages that run on the CPU (``runs_on="cpu"``): every
  benchmark of benchmarks/README.md on the reference CPU host, each in-process to its end (no
  time limit), then one summary of every ratio against its goal;
- `scripts/gpu_check.py` runs the stages that run on the GPU (``runs_on="gpu"``), each as a
  subprocess under its time limit; its ``--dry-run`` runs the same stages on the CPU with tiny sizes
  (``dry_run_args``, ``dry_run_limit_s``): a rehearsal whose figures mean nothing.

A stage's command is a template, split like a shell command line, then each word filled in by the
driver (`argv`). Placeholders, each one word (a list-valued one stands alone and becomes 0 or more
words): ``{python}`` the driver's interpreter; for the GPU check also ``{device}`` (cuda, or cpu in a
dry run), ``{precision}`` (bf16, or "no" in a dry run on a CPU without bf16 arithmetic),
``{joeynmt_python}``, ``{junit_xml}``, ``{corpus}``, ``{run_dir}``, ``{accelerate_launch}`` (a list)
and ``{accelerate_cpu}`` (a list: ``--cpu`` in a dry run).

Scripts of benchmarks/ that are in no stage run alone (their docstrings say how): bench_compile,
bench_ct2, bench_data, bench_ensembles_constraints, bench_explorer, bench_onnx, check_deploy_exports,
compare_data_paths; the one-off probes in benchmarks/probes/ are in none either. This module
imports nothing outside the standard library: scripts/gpu_check.py reads it on a GPU machine
before anything is installed.

    python benchmarks/stages.py      # the table
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Stage:
    name: str  # unique among the stages of its `runs_on`; the key of the drivers' --only and results
    runs_on: str  # "cpu": benchmarks/run_all.py; "gpu": scripts/gpu_check.py (its --dry-run: on the CPU)
    command: str  # the template (module docstring); the GPU check appends gpu_args or dry_run_args
    measures: str  # what the stage measures, against which peer
    limit_s: float | None = None  # the GPU run's time limit; None: run to the end (run_all.py)
    gpu_args: str = ""  # GPU stages: the full-size arguments of the real run
    dry_run_args: str = ""  # GPU stages: the tiny sizes of the CPU rehearsal
    dry_run_limit_s: float | None = None  # GPU stages: the rehearsal's limit (a busy shared CPU gets room)
    env: dict = field(default_factory=dict)  # extra environment of the stage's process

    def argv(self, dry_run: bool = False, **values) -> list[str]:
        """The command as a list of words, ``values`` filled in (see the module docstring)."""
        extra = self.dry_run_args if dry_run else self.gpu_args
        words = []
        for word in shlex.split(f"{self.command} {extra}"):
            key = word[1:-1] if word.startswith("{") and word.endswith("}") else None
            if key is not None and isinstance(values.get(key), (list, tuple)):
                words.extend(str(v) for v in values[key])
            else:
                words.append(word.format(**values))
        return words

    def limit(self, dry_run: bool = False) -> float | None:
        return self.dry_run_limit_s if dry_run else self.limit_s

    @property
    def script(self) -> str | None:
        """The benchmark script the command runs (``benchmarks/<name>.py``), if it runs one."""
        return next((w for w in shlex.split(self.command) if w.startswith("benchmarks/") and w.endswith(".py")), None)


_TRAIN_STEP = "{python} benchmarks/bench_train_step.py --device {device} --mixed-precision {precision}"
_TRAIN_STEP_GPU = "--max-tokens 16384 --rounds 5 --batches 4 --peak-n 8192"
_TRAIN_STEP_DRY = "--max-tokens 256 --rounds 1 --batches 1 --peak-n 512"
_TRAINING = (
    "{accelerate_launch} --num_processes 1 --num_machines 1 --mixed_precision bf16 --dynamo_backend no "
    "{accelerate_cpu} -m attention_seq2seq.training.train "
    "--recipe training/recipes/multi30k-transformer-small.yaml --corpus {corpus} --output_dir {run_dir} "
    "--mixed_precision bf16 --num_plot_sentences 0 --test_greedy false --test_bootstrap null "
    "--keep_best_k 1 --average_last_k 0 --log_with none"
)

STAGES: tuple[Stage, ...] = (
    # ---- benchmarks/run_all.py, on the CPU (issue numbering of benchmarks/README.md; the longest last)
    Stage(
        "train_step",
        "cpu",
        "{python} benchmarks/bench_train_step.py",
        "benchmarks 1 and 5: Transformer training step, non-padding target tokens/s and MFU, ours vs Marian",
    ),
    Stage(
        "train_step_bf16",
        "cpu",
        "{python} benchmarks/bench_train_step.py --mixed-precision bf16",
        "1b / 5b (information): the same under CPU bf16 autocast",
    ),
    Stage(
        "generate",
        "cpu",
        "{python} benchmarks/bench_generate.py",
        "benchmark 3: translation of Multi30k test2016, greedy and beam 5, sentences/s, ours vs Marian",
    ),
    Stage(
        "generate_min_new_tokens",
        "cpu",
        "{python} benchmarks/bench_generate.py --force-length min-new-tokens --beams 1",
        "3 (information): greedy, the length forced by min_new_tokens, the first method",
    ),
    Stage(
        "rnn",
        "cpu",
        "{python} benchmarks/bench_rnn.py",
        "benchmark 4: RNN training step tokens/s, our Luong and Bahdanau vs JoeyNMT 2.3 "
        "(skipped without the JoeyNMT venv, benchmarks/joeynmt_env.sh)",
    ),
    Stage(
        "rnn_bf16",
        "cpu",
        "{python} benchmarks/bench_rnn.py --mixed-precision bf16",
        "4b (information): our RNN step under CPU bf16 autocast vs JoeyNMT in float32 and bf16",
    ),
    Stage(
        "memory",
        "cpu",
        "{python} benchmarks/bench_memory.py",
        "benchmark 6: peak memory of a ~4,000-token training step, ours vs Marian",
    ),
    Stage(
        "pipeline",
        "cpu",
        "{python} benchmarks/bench_pipeline.py",
        "benchmark 2: the whole training pipeline for the same wall time, our trainer vs Seq2SeqTrainer + "
        "Marian, non-padding target tokens/s",
    ),
    # ---- scripts/gpu_check.py, on the GPU (issue 33); limits: ~8 minutes with the install
    Stage(
        "tests",
        "gpu",
        "{python} -P -m pytest -q -p no:cacheprovider -m device --junitxml {junit_xml} "
        "tests/test_device.py tests/test_training_train.py",
        "pytest -m device: both families on the device vs the CPU, eager vs SDPA, bf16/fp16 autocast, "
        "save/load, the trainer's resume",
        limit_s=150,
        dry_run_limit_s=240,
    ),
    Stage(
        "train_step_small",
        "gpu",
        f"{_TRAIN_STEP} --model small --result-name train_step_small",
        "Transformer-small step, ours vs Marian, bf16, 16k-token batches: tokens/s and MFU against the "
        "measured bf16 matmul peak",
        limit_s=75,
        gpu_args=_TRAIN_STEP_GPU,
        dry_run_args=_TRAIN_STEP_DRY,
        dry_run_limit_s=240,
    ),
    Stage(
        "train_step_base",
        "gpu",
        f"{_TRAIN_STEP} --model base --result-name train_step_base",
        "the same for Transformer-base",
        limit_s=90,
        gpu_args=_TRAIN_STEP_GPU,
        dry_run_args=_TRAIN_STEP_DRY,
        dry_run_limit_s=240,
    ),
    Stage(
        "generate_beam5",
        "gpu",
        "{python} benchmarks/bench_generate.py --device {device} --beams 5 --result-name generate_beam5",
        "beam-5 translation of Multi30k test2016, sentences/s, ours vs Marian",
        limit_s=75,
        gpu_args="--rounds 3",
        dry_run_args="--sentences 16 --batch-size 8 --rounds 1",
        dry_run_limit_s=180,
    ),
    Stage(
        "rnn",
        "gpu",
        "{python} benchmarks/bench_rnn.py --device {device} --result-name rnn --joeynmt-python {joeynmt_python}",
        "the RNN step vs JoeyNMT (cuDNN LSTMs on both sides), tokens/s",
        limit_s=60,
        gpu_args="--rounds 4 --batches 3",
        dry_run_args="--max-tokens 256 --rounds 1 --batches 1 --attentions luong",
        dry_run_limit_s=240,
    ),
    Stage(
        "training",
        "gpu",
        _TRAINING,
        "accelerate launch of the Multi30k Transformer-small recipe in bf16 for a fixed number of updates: "
        "updates/s and the training loss from first log to last",
        limit_s=210,
        # ~1.5 minutes of updates on an H200 (an estimate: no GPU has run it yet); max_time_minutes
        # caps the loop at 2 if the estimate is off, so tokenizer, loop and test fit the limit.
        gpu_args="--max_tokens 4096 --max_steps 3000 --warmup_steps 500 --log_every 100 --eval_every 3000 "
        "--save_every 3000 --max_eval_samples 200 --max_test_samples 500 --test_num_beams 5 --max_time_minutes 2",
        dry_run_args="--max_steps 12 --log_every 3 --eval_every 12 --save_every 12 --warmup_steps 3 "
        "--max_train_samples 300 --vocab_size 500 --max_eval_samples 8 --max_test_samples 8 --test_num_beams 2 "
        "--model_config.d_model 32 --model_config.encoder_ffn_dim 64 --model_config.decoder_ffn_dim 64 "
        "--model_config.encoder_attention_heads 2 --model_config.decoder_attention_heads 2 "
        "--model_config.encoder_layers 1 --model_config.decoder_layers 1",
        dry_run_limit_s=300,
        # -P for the python that accelerate starts: the repository root must not shadow the
        # installed package (its attention_seq2seq/ folder holds only part of it).
        env={"PYTHONSAFEPATH": "1"},
    ),
)

RUNS_ON = ("cpu", "gpu")


def stages(runs_on: str) -> dict[str, Stage]:
    """The stages of one driver, by name, in the table's order."""
    if runs_on not in RUNS_ON:
        raise ValueError(f"runs_on must be one of {RUNS_ON}; got {runs_on!r}")
    return {stage.name: stage for stage in STAGES if stage.runs_on == runs_on}


def table(runs_on: str | None = None) -> str:
    """The stages as a Markdown table (all of them, or those of one driver)."""
    rows = ["| stage | runs on | limit (dry run) | command | measures |", "|---|---|---|---|---|"]
    for s in STAGES:
        if runs_on not in (None, s.runs_on):
            continue
        limit = "none" if s.limit_s is None else f"{s.limit_s:.0f} s ({s.dry_run_limit_s:.0f} s)"
        rows.append(f"| {s.name} | {s.runs_on} | {limit} | `{s.command}` | {s.measures} |")
    return "\n".join(rows)


def _check() -> None:
    for runs_on in RUNS_ON:
        names = [s.name for s in STAGES if s.runs_on == runs_on]
        assert len(names) == len(set(names)), f"two {runs_on} stages share a name: {names}"
    for s in STAGES:
        assert s.runs_on in RUNS_ON, s
        assert (s.limit_s is None) == (s.runs_on == "cpu") == (s.dry_run_limit_s is None), s


_check()

if __name__ == "__main__":
    print(table())
