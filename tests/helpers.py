"""What the test files share, besides conftest.py's fixtures: corpus slices, tiny models, tiny
tokenizers, tiny trained runs and a process-tree runner. No test file imports another test file
(tests/test_test_layout.py checks it); they import from here.

Sections:

- corpora: the shared corpora (``../shared/data``, or ``ATTN_SEQ2SEQ_SHARED_DATA``) and the pairs
  committed under tests/fixtures/, read in place, never copied;
- tiny models: :func:`tiny_model` and :func:`tiny_model_config` (every family, two presets), the
  RNN variant grid of the RNN tests (:func:`rnn_model`) and the hand-made batches they run on;
- tiny tokenizers and tiny trained runs (the command line's, fine-tuning's and the explorer's
  tests): :func:`tiny_tokenizer`, :func:`build_tokenizer`, :func:`build_tiny_run`;
- Seq2SeqTrainer gradients (:func:`trainer_gradients`, also run by a torchrun script);
- :func:`run_process_tree` for launchers of several ranks.

pytest puts tests/ on ``sys.path`` (its default "prepend" import mode), so ``from helpers import
...`` works in every test file, and a subprocess script does ``sys.path.insert(0, "tests/")`` first.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path

import psutil
import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------------------------------------
# Corpora
# ------------------------------------------------------------------------------------------------


def shared_data_dir() -> Path:
    env = os.environ.get("ATTN_SEQ2SEQ_SHARED_DATA")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data"


# Public-domain Bible verse pairs committed with the tests (fixtures/bible-es-en/README.md): the
# behaviours checked on Multi30k slices run on these where ../shared/data is absent.
FIXTURE_PAIRS = REPO_ROOT / "tests" / "fixtures" / "bible-es-en"


# Tatoeba zh-en pairs (CC BY 2.0 FR, attribution in fixtures/tatoeba-cmn-eng/cmn.txt and README.md):
# 300 train, 50 dev and 50 test pairs of the shared split, in its layout, for the Chinese checks.
FIXTURE_TATOEBA = REPO_ROOT / "tests" / "fixtures" / "tatoeba-cmn-eng"


def tatoeba_dir() -> Path:
    """The Tatoeba cmn-eng folder (``train|dev|test.tsv``, ``cmn.txt``): the shared corpus when
    present, else the committed slice of it."""
    shared = shared_data_dir() / "tatoeba-cmn-eng"
    return shared if (shared / "train.tsv").exists() else FIXTURE_TATOEBA


def _pairs_source() -> tuple[Path, str, str, dict[str, str]]:
    """(folder, source language, target language, {train|val|test: file stem}) of the test pairs:
    the shared Multi30k corpus when present, else the committed Bible pairs."""
    multi30k = shared_data_dir() / "multi30k"
    if (multi30k / "train.en").exists():
        return multi30k, "de", "en", {"train": "train", "val": "val", "test": "test2016"}
    return FIXTURE_PAIRS, "es", "en", {"train": "train", "val": "dev", "test": "test"}


def read_pairs(n: int, split: str = "train", offset: int = 0) -> list[tuple[str, str]]:
    """``n`` (source, target) pairs from ``offset`` of the ``train``, ``val`` or ``test`` split:
    Multi30k de-en from ../shared/data when present, else the committed Bible es-en pairs."""
    root, src, tgt, stems = _pairs_source()
    stem = stems[split]
    with (
        open(root / f"{stem}.{src}", encoding="utf-8") as f_src,
        open(root / f"{stem}.{tgt}", encoding="utf-8") as f_tgt,
    ):
        pairs = [(s.rstrip("\n"), t.rstrip("\n")) for s, t in zip(f_src, f_tgt)]
    if offset + n > len(pairs):
        raise ValueError(f"{root} has {len(pairs)} {split} pairs; asked for {n} from {offset}")
    return pairs[offset : offset + n]


def pairs_corpus_spec() -> str:
    """The corpus spec of `read_pairs`' pairs, for the loaders and the training script."""
    root, src, tgt, _ = _pairs_source()
    kind = "multi30k" if root.name == "multi30k" else "text"
    return f"{kind}:{root}:{src}-{tgt}"


def pairs_languages() -> tuple[str, str]:
    return _pairs_source()[1:3]


def write_jsonl(path: Path, pairs) -> Path:
    with open(path, "w", encoding="utf-8") as handle:
        for source, target in pairs:
            handle.write(json.dumps({"source": source, "target": target}, ensure_ascii=False) + "\n")
    return path


# ------------------------------------------------------------------------------------------------
# Float32 rounding
# ------------------------------------------------------------------------------------------------


def float32_rounding(reference: torch.Tensor, dot_length: int, layers: int = 1) -> float:
    """How far two correct float32 computations of ``reference`` may lie apart when they add the
    same products in other orders (a merged LoRA weight, another library's kernels, another CPU's
    vector width): layers · K · eps · max|reference|.

    A dot product of length K rounded in float32 is off by at most about K·u·Σ|w_k x_k| (u = eps/2,
    Higham, Accuracy and Stability of Numerical Algorithms, §3.1), so two orders of it differ by up
    to K·eps·Σ|w_k x_k|; Σ|w_k x_k| is taken as the largest |reference| (sums of terms of random
    sign are about √K times their result, and their rounding errors about √K times below the
    bound, so the two factors cancel). Each of ``layers`` such products on the way to the output
    adds its own, passed on at that scale by layers that do not amplify (norms, residuals,
    contractive recurrences).
    """
    return layers * dot_length * torch.finfo(torch.float32).eps * float(reference.abs().max())


# ------------------------------------------------------------------------------------------------
# Tiny models
# ------------------------------------------------------------------------------------------------

PAD, BOS, EOS, UNK = 0, 1, 2, 3  # the special-token ids of every tiny model and hand-made batch

# The model sizes of tiny_model's presets, by family:
#   "tiny":  the smallest model of each family the tests build; every caller states what it needs
#            on top (vocab_size always);
#   "small": the Transformer tests' model (test_transformer_seq2seq.py, the CPU fast paths, the
#            device and loss tests): 2 + 2 layers, d_model 16, 4 heads, vocabulary 37, no dropout.
# The smallest Transformer the training tests build: its model_config.
TINY_TRANSFORMER = {
    "d_model": 32,
    "encoder_layers": 1,
    "decoder_layers": 1,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
}

TINY_SIZES = {
    "rnn_seq2seq": dict(embedding_size=8, hidden_size=8),
    "transformer_seq2seq": dict(
        d_model=8,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=16,
        decoder_ffn_dim=16,
    ),
}
SMALL_SIZES = {
    "transformer_seq2seq": dict(
        vocab_size=37,
        d_model=16,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        dropout=0.0,
        max_position_embeddings=64,
    ),
}
PRESETS = {"tiny": TINY_SIZES, "small": SMALL_SIZES}
# What a preset's model is unless the call says otherwise: "small" models are built in eval mode
# with SDPA attention set on the config; "tiny" ones in training mode with the config's default.
_PRESET_DEFAULTS = {
    "tiny": dict(eval=False, attn_implementation=None),
    "small": dict(eval=True, attn_implementation="sdpa"),
}


def tiny_model_config(
    family: str = "transformer_seq2seq", vocab_size: int | None = None, *, preset: str = "tiny", **overrides
):
    """A tiny config of ``family`` (``"rnn_seq2seq"`` or ``"transformer_seq2seq"``, as in the
    model registry): the sizes of ``preset`` (:data:`PRESETS`) with ``vocab_size`` (when given)
    and ``overrides`` on top."""
    from attention_seq2seq.modeling.registry import BY_MODEL_TYPE

    values = dict(PRESETS[preset][family])
    if vocab_size is not None:
        values["vocab_size"] = vocab_size
    values.update(overrides)
    return BY_MODEL_TYPE[family].config_cls()(**values)


def tiny_model(
    family: str = "transformer_seq2seq",
    vocab_size: int | None = None,
    *,
    preset: str = "tiny",
    seed: int | None = None,
    attn_implementation: str | None = None,
    eval: bool | None = None,
    **overrides,
):
    """A ``...ForConditionalGeneration`` of :func:`tiny_model_config` (same ``family``,
    ``vocab_size``, ``preset`` and ``overrides``).

    ``seed``: initialised after ``torch.manual_seed(seed)`` (else from the current random state).
    ``attn_implementation``: set on the config before the model is built (``preset="small"``:
    ``"sdpa"`` unless given; ``"tiny"``: the config's default). ``eval``: the model in eval mode
    (``preset="small"``: yes unless given; ``"tiny"``: no, training mode as built).

        tiny_model("rnn_seq2seq", 40, attention="bahdanau")   # the smallest RNN, vocabulary 40
        tiny_model(preset="small", norm_order="pre")          # the Transformer tests' model
    """
    from attention_seq2seq.modeling.registry import BY_MODEL_TYPE

    defaults = _PRESET_DEFAULTS[preset]
    attn_implementation = defaults["attn_implementation"] if attn_implementation is None else attn_implementation
    eval = defaults["eval"] if eval is None else eval
    config = tiny_model_config(family, vocab_size, preset=preset, **overrides)
    if attn_implementation is not None:
        config._attn_implementation = attn_implementation
    if seed is not None:
        torch.manual_seed(seed)
    model = BY_MODEL_TYPE[family].lm_cls()(config)
    return model.eval() if eval else model


def padded_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For the "small" Transformer (vocabulary 37): two sources (lengths 7 and 4, right-padded)
    and decoder inputs of length 6."""
    input_ids = torch.randint(4, 37, (2, 7))
    input_ids[0, -1] = EOS
    input_ids[1, 3] = EOS
    input_ids[1, 4:] = PAD
    attention_mask = (input_ids != PAD).long()
    decoder_input_ids = torch.randint(4, 37, (2, 6))
    decoder_input_ids[:, 0] = BOS
    return input_ids, attention_mask, decoder_input_ids


# The Transformer layouts every export and ecosystem test covers (position table × norm order ×
# norm type, shared or separate embeddings).
TRANSFORMER_LAYOUTS = {
    "post-sinusoidal": dict(norm_order="post"),
    "pre-sinusoidal": dict(norm_order="pre"),
    "pre-learned": dict(norm_order="pre", position_embedding_type="learned"),
    "post-learned-unshared": dict(
        norm_order="post", position_embedding_type="learned", share_encoder_decoder_embeddings=False
    ),
    "pre-scalenorm-fixnorm": dict(norm_order="pre", norm_type="scale_norm", fix_norm=True),
}


def layout_transformer(vocab_size: int, layout: str, seed: int = 0, **overrides):
    """The export and ecosystem tests' Transformer of :data:`TRANSFORMER_LAYOUTS` ``[layout]``:
    2 + 2 layers, d_model 16, 2 heads, no dropout, a wide init (distinct logits), eval mode."""
    sizes = dict(
        d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64, dropout=0.0, init_std=0.3,
    )  # fmt: skip
    sizes.update(TRANSFORMER_LAYOUTS[layout])
    sizes.update(overrides)
    return tiny_model("transformer_seq2seq", vocab_size, seed=seed, eval=True, **sizes)


def one_line_error(capsys, main, argv: list[str]) -> str:
    """Run the command line ``main(argv)``, expecting exit status 2 and exactly one line on stderr
    (no traceback); returns that line."""
    import pytest

    with pytest.raises(SystemExit) as exit_info:
        raise SystemExit(main(argv))
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    return lines[0]


RNN_VOCAB = 23

# The RNN tests' grid over cell × attention × score × window × input feeding × mode (+ layers,
# bridge, coverage). Each id names the variant.
RNN_VARIANTS = {
    "none-gru-last": dict(attention="none", bridge="last"),
    "none-lstm-projection-2layers": dict(attention="none", cell_type="lstm", encoder_layers=2, decoder_layers=2),
    "bahdanau-gru": dict(attention="bahdanau"),
    "bahdanau-lstm-coverage": dict(attention="bahdanau", cell_type="lstm", coverage=True),
    "bahdanau-gru-hard-zero-bridge-2layer-decoder": dict(
        attention="bahdanau", attention_mode="hard", bridge="zero", decoder_layers=2
    ),
    "luong-general-feed-gru": dict(attention="luong", score="general"),
    "luong-dot-nofeed-lstm-last-bridge": dict(
        attention="luong", score="dot", input_feeding=False, cell_type="lstm", bridge="last"
    ),
    "luong-concat-nofeed-coverage": dict(attention="luong", score="concat", input_feeding=False, coverage=True),
    "luong-cosine-feed-2layers": dict(attention="luong", score="cosine", encoder_layers=2, decoder_layers=2),
    "luong-scaled_dot-nofeed-local-m": dict(
        attention="luong", score="scaled_dot", input_feeding=False, window="local-m", window_size=1
    ),
    "luong-general-feed-local-p-lstm": dict(
        attention="luong", score="general", window="local-p", window_size=2, cell_type="lstm"
    ),
    "luong-general-nofeed-local-p-hard": dict(
        attention="luong", input_feeding=False, window="local-p", window_size=2, attention_mode="hard"
    ),
    "luong-dot-feed-local-m-hard-unidirectional": dict(
        attention="luong", score="dot", window="local-m", window_size=2, attention_mode="hard", bidirectional=False
    ),
}


def rnn_model(variant: str, vocab_size: int = RNN_VOCAB, hidden_size: int = 8, embedding_size: int = 6, **overrides):
    """The RNN of :data:`RNN_VARIANTS` ``[variant]``, seeded with 0, in eval mode."""
    from attention_seq2seq import RNNSeq2SeqConfig, RNNSeq2SeqForConditionalGeneration

    # A wide init range makes the tiny model's attention peaked and its states distinct, so the
    # checks compare sharply different numbers rather than near-uniform ones.
    kwargs = dict(
        RNN_VARIANTS[variant],
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        embedding_size=embedding_size,
        init_range=1.0,
    )
    kwargs.update(overrides)
    torch.manual_seed(0)
    return RNNSeq2SeqForConditionalGeneration(RNNSeq2SeqConfig(**kwargs)).eval()


def pad_rows(rows, value=PAD):
    """Right-padded ids and their attention mask."""
    width = max(map(len, rows))
    ids = torch.tensor([row + [value] * (width - len(row)) for row in rows])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    return ids, mask


def source_batch():
    """For :func:`rnn_model`: three right-padded sources of lengths 5, 2 and 4, each ending in </s>."""
    rows = [[5, 6, 7, 8, EOS], [9, EOS], [10, 11, 12, EOS]]
    return pad_rows(rows)


def target_batch():
    """For :func:`rnn_model`: the decoder inputs of :func:`source_batch`'s three sentences."""
    rows = [[BOS, 13, 14, 15, 16, 17], [BOS, 18, 19], [BOS, 20, 21, 22]]
    return pad_rows(rows)


# ------------------------------------------------------------------------------------------------
# Tiny tokenizers and tiny trained runs
# ------------------------------------------------------------------------------------------------
# A "run" is a folder in the training-output layout of docs/DESIGN.md: ``model/`` (weights,
# config, generation config, tokenizer), ``metrics.json`` and ``checkpoints/step_<N>/`` with
# ``model.safetensors`` (what ``accelerator.save_state`` writes for one model). It is trained by a
# short manual loop on a real corpus slice (read_pairs), so the tests of the command line,
# fine-tuning, evaluation and the explorer do not depend on the Accelerate script's options. Each
# run is built once per test session and cached.

FAMILIES = ("rnn_seq2seq", "transformer_seq2seq")
NUM_PAIRS = 300
VOCAB_SIZE = 500
TRAIN_STEPS = 60
CHECKPOINT_STEPS = (40, 60)

_RUNS: dict[tuple[str, str], Path] = {}
_TOKENIZERS: dict[str, object] = {}


def tiny_tokenizer(root: Path):
    """A unigram tokenizer trained on the first NUM_PAIRS training pairs (both sides)."""
    key = str(root)
    if key not in _TOKENIZERS:
        from attention_seq2seq.data.tokenization import train_tokenizer

        _TOKENIZERS[key] = train_tokenizer(read_pairs(NUM_PAIRS), vocab_size=VOCAB_SIZE)
    return _TOKENIZERS[key]


def build_tokenizer(pairs):
    """A 400-piece tokenizer of ``pairs``: the package tokenizer when the data layer provides it,
    else an equivalent one built here."""
    try:
        from attention_seq2seq.data.tokenization import train_tokenizer
    except ImportError:
        train_tokenizer = None
    if train_tokenizer is not None:
        return train_tokenizer(pairs, vocab_size=400)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.Unigram())
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=400, special_tokens=["<pad>", "<s>", "</s>", "<unk>"], unk_token="<unk>"
    )
    backend.train_from_iterator([text for pair in pairs for text in pair], trainer)
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def tiny_run_config(family: str, vocab_size: int):
    """The config of a tiny run's model: the "tiny" preset, widened to 32, no dropout."""
    if family == "rnn_seq2seq":
        return tiny_model_config(
            family, vocab_size, embedding_size=32, hidden_size=32, cell_type="gru", attention="bahdanau", dropout=0.0
        )
    return tiny_model_config(
        family, vocab_size, d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64, dropout=0.0, max_position_embeddings=128
    )


def training_batches(tokenizer, pairs, batch_size: int):
    """Tokenized batches of ``pairs`` (at most 64 tokens a side), labels -100 on padding."""
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        batch = tokenizer(
            [s for s, _ in chunk],
            text_target=[t for _, t in chunk],
            padding=True,
            truncation=True,
            max_length=64,
            return_tensors="pt",
        )
        batch["labels"] = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
        yield batch


def build_tiny_run(family: str, root: Path) -> Path:
    """Train a tiny ``family`` model for TRAIN_STEPS steps and write a run folder under ``root``."""
    from safetensors.torch import save_file
    from transformers import AutoModelForSeq2SeqLM

    import attention_seq2seq  # noqa: F401  (registers the Auto classes)

    key = (family, str(root))
    if key in _RUNS:
        return _RUNS[key]
    torch.manual_seed(0)
    tokenizer = tiny_tokenizer(root)
    model = AutoModelForSeq2SeqLM.from_config(tiny_run_config(family, len(tokenizer)))
    model.generation_config.max_new_tokens = 24
    model.generation_config.num_beams = 2
    pairs = read_pairs(NUM_PAIRS)
    batches = list(training_batches(tokenizer, pairs, batch_size=20))
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    run = root / f"run-{family}"
    model.train()
    losses = []
    for step in range(1, TRAIN_STEPS + 1):
        loss = model(**batches[(step - 1) % len(batches)]).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        if step in CHECKPOINT_STEPS:
            folder = run / "checkpoints" / f"step_{step}"
            folder.mkdir(parents=True)
            state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
            # Like accelerator.save_state: safetensors stores a tied tensor once.
            save_file(_drop_tied(model, state), str(folder / "model.safetensors"), metadata={"format": "pt"})
    model.eval()
    model.save_pretrained(run / "model")
    tokenizer.save_pretrained(run / "model")
    source_lang, target_lang = pairs_languages()
    metrics = {
        "model_family": family,
        "corpus": {
            "spec": "multi30k",
            "name": "Multi30k",
            "source_lang": source_lang,
            "target_lang": target_lang,
            "license": "custom",
            "attribution": "Elliott et al. 2016",
        },
        "train": {
            "steps": TRAIN_STEPS,
            "epochs": TRAIN_STEPS * 20 / NUM_PAIRS,
            "wall_time_s": 1.0,
            "target_tokens_per_s": 1.0,
            "final_train_loss": losses[-1],
        },
        "validation": [],
        "test": {},
    }
    (run / "metrics.json").write_text(json.dumps(metrics, indent=2), encoding="utf-8")
    _RUNS[key] = run
    return run


def _drop_tied(model, state: dict) -> dict:
    seen: dict[int, str] = {}
    kept = {}
    for name, tensor in state.items():
        ptr = dict(model.state_dict())[name].data_ptr()
        if ptr in seen:
            continue
        seen[ptr] = name
        kept[name] = tensor
    return kept


# ------------------------------------------------------------------------------------------------
# Gradients of one Seq2SeqTrainer update (test_finetune_trainer.py: accumulation and DDP)
# ------------------------------------------------------------------------------------------------


def _tiny_float64_model(family: str):
    if family == "transformer_seq2seq":
        model = tiny_model(family, 29, seed=0, dropout=0.0, max_position_embeddings=32, label_smoothing=0.1)
    else:  # coverage: its loss term is normalised by the target tokens as well
        model = tiny_model(
            family, 29, seed=0, embedding_size=6, dropout=0.0, attention="bahdanau", coverage=True, label_smoothing=0.1
        )
    return model.double()


def _two_examples_of_2_and_10_target_tokens():
    return [
        {"input_ids": [5, 6, 7, 2], "labels": [8, 2]},
        {"input_ids": [9, 10, 2], "labels": [11, 12, 13, 14, 15, 16, 17, 18, 19, 2]},
    ]


def _pad_collator(examples):
    def pad(rows, value):
        width = max(len(row) for row in rows)
        return torch.tensor([row + [value] * (width - len(row)) for row in rows])

    sources = [example["input_ids"] for example in examples]
    return {
        "input_ids": pad(sources, 0),
        "attention_mask": pad([[1] * len(row) for row in sources], 0),
        "labels": pad([example["labels"] for example in examples], -100),
    }


def trainer_gradients(family: str, tmp_path: Path, batch_size: int, accumulation: int) -> dict:
    """The gradients of the first update of a Seq2SeqTrainer run (SGD, no clipping), by parameter,
    of a tiny float64 ``family`` model on two examples of 2 and 10 target tokens."""
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments, TrainerCallback

    gradients = {}

    class RecordGradients(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            if not gradients:
                gradients.update(
                    {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
                )

    model = _tiny_float64_model(family)
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path / f"{family}-{batch_size}x{accumulation}"),
        max_steps=1,
        per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=accumulation,
        optim="sgd",
        learning_rate=0.1,
        lr_scheduler_type="constant",
        max_grad_norm=0.0,
        weight_decay=0.0,
        label_smoothing_factor=0.0,
        save_strategy="no",
        report_to="none",
        remove_unused_columns=False,
        dataloader_num_workers=0,
        use_cpu=True,
        seed=0,
        logging_steps=1,
    )
    trainer = Seq2SeqTrainer(
        model=model,
        args=args,
        data_collator=_pad_collator,
        train_dataset=_two_examples_of_2_and_10_target_tokens(),
        callbacks=[RecordGradients()],
    )
    trainer.train()
    return gradients


# ------------------------------------------------------------------------------------------------
# Processes
# ------------------------------------------------------------------------------------------------


def run_process_tree(command: list[str], timeout: float, **popen_kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(command, capture_output=True, text=True)`` for launchers of several ranks
    (``accelerate launch``, ``torchrun``): on a timeout or Ctrl-C it kills the whole process
    tree, because torchrun's agent starts each rank in a session of its own, out of reach of a
    signal to the launcher; a timeout fails the test with the end of stderr."""
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen_kwargs)
    try:
        stdout, stderr = launcher.communicate(timeout=timeout)
    except BaseException as error:  # a hang (ranks waiting in mismatched collectives) or Ctrl-C
        tree = psutil.Process(launcher.pid).children(recursive=True) + [psutil.Process(launcher.pid)]
        for process in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        psutil.wait_procs(tree, timeout=30)
        stdout, stderr = launcher.communicate()
        if isinstance(error, subprocess.TimeoutExpired):
            pytest.fail(
                f"{Path(command[0]).name} did not finish in {timeout} s "
                f"(ranks hung in a collective?):\n{stderr[-3000:]}"
            )
        raise
    return subprocess.CompletedProcess(command, launcher.returncode, stdout, stderr)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a launcher's rendezvous)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
