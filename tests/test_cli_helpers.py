"""Tiny trained models on a real corpus slice (Multi30k from ../shared/data, else the committed Bible
pairs: conftest.read_pairs), shared by test_cli*.py and test_finetune*.py.

A "run" is a folder in the training-output layout of docs/DESIGN.md: ``model/`` (weights,
config, generation config, tokenizer), ``metrics.json`` and ``checkpoints/step_<N>/`` with
``model.safetensors`` (what ``accelerator.save_state`` writes for one model). It is trained by a
short manual loop, so these tests do not depend on the Accelerate script's options. Each run is
built once per test session and cached.

This module holds no tests; pytest imports it through the test directory on ``sys.path``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from conftest import pairs_languages, read_pairs, tiny_model_config

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


def tiny_config(family: str, vocab_size: int):
    if family == "rnn_seq2seq":
        return tiny_model_config(
            family, vocab_size, embedding_size=32, hidden_size=32, cell_type="gru", attention="bahdanau", dropout=0.0
        )
    return tiny_model_config(
        family, vocab_size, d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64, dropout=0.0, max_position_embeddings=128
    )


def _batches(tokenizer, pairs, batch_size: int):
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
    model = AutoModelForSeq2SeqLM.from_config(tiny_config(family, len(tokenizer)))
    model.generation_config.max_new_tokens = 24
    model.generation_config.num_beams = 2
    pairs = read_pairs(NUM_PAIRS)
    batches = list(_batches(tokenizer, pairs, batch_size=20))
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


def write_jsonl(path: Path, pairs) -> Path:
    with open(path, "w", encoding="utf-8") as handle:
        for source, target in pairs:
            handle.write(json.dumps({"source": source, "target": target}, ensure_ascii=False) + "\n")
    return path
