"""The sides of a comparison: our Transformer and MarianMTModel built with the same dimensions
(`TransformerDims`, `shared_config_kwargs`), the training step both get (`make_train_step`), and
JoeyNMT 2.3, the RNN benchmark's peer, run in its own virtual environment as a long-lived
subprocess (`JoeyWorker`, speaking the line protocol of benchmarks/joeynmt_worker.py)."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from harness.machine import REPO_ROOT

JOEYNMT_PYTHON = Path(os.environ.get("JOEYNMT_PYTHON") or REPO_ROOT / ".venv-joeynmt" / "bin" / "python")
JOEYNMT_WORKER = Path(__file__).resolve().parents[1] / "joeynmt_worker.py"


# ----------------------------------------------------------------------------------------------
# The two Transformer sides, same dimensions
# ----------------------------------------------------------------------------------------------


@dataclass
class TransformerDims:
    """Multi30k-sized Transformer used on both sides (paper recipe shrunk to the corpus)."""

    vocab_size: int = 8000
    d_model: int = 256
    layers: int = 3
    heads: int = 8
    ffn: int = 512
    dropout: float = 0.1
    max_positions: int = 256

    @classmethod
    def from_config(cls, config) -> "TransformerDims":
        """The dimensions of a trained model's `TransformerSeq2SeqConfig` (e.g. to build a Marian peer)."""
        return cls(vocab_size=config.vocab_size, d_model=config.d_model, layers=config.encoder_layers,
                   heads=config.encoder_attention_heads, ffn=config.encoder_ffn_dim,
                   max_positions=config.max_position_embeddings)  # fmt: skip


# Transformer-small is the dimensions above; Transformer-base is the paper's base model (Vaswani et
# al. 2017, Table 3: 6 + 6 layers, d_model 512, 8 heads, FFN 2048) on the same vocabulary.
MODEL_PRESETS = {
    "small": TransformerDims(),
    "base": TransformerDims(d_model=512, layers=6, heads=8, ffn=2048),
}


def dims_for(model: str) -> TransformerDims:
    """The `TransformerDims` of a preset name ('small' or 'base'); ValueError names the valid ones."""
    if model not in MODEL_PRESETS:
        raise ValueError(f"--model must be one of {sorted(MODEL_PRESETS)}; got {model!r}")
    return MODEL_PRESETS[model]


def shared_config_kwargs(dims: TransformerDims) -> dict:
    """The config fields both peers take under the same names: one place, so ours and Marian
    cannot drift apart in size, dropout or special-token ids."""
    return dict(
        vocab_size=dims.vocab_size,
        d_model=dims.d_model,
        encoder_layers=dims.layers,
        decoder_layers=dims.layers,
        encoder_attention_heads=dims.heads,
        decoder_attention_heads=dims.heads,
        encoder_ffn_dim=dims.ffn,
        decoder_ffn_dim=dims.ffn,
        activation_function="relu",
        dropout=dims.dropout,
        attention_dropout=0.0,
        activation_dropout=0.0,
        scale_embedding=True,
        max_position_embeddings=dims.max_positions,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    )


def build_ours(dims: TransformerDims, tokenizer=None, seed: int = 0):
    import torch
    from attention_seq2seq.configuration.configuration_transformer_seq2seq import TransformerSeq2SeqConfig
    from attention_seq2seq.modeling.modeling_transformer_seq2seq import TransformerSeq2SeqForConditionalGeneration

    torch.manual_seed(seed)
    config = TransformerSeq2SeqConfig(
        **shared_config_kwargs(dims), position_embedding_type="sinusoidal", norm_order="post"
    )
    return TransformerSeq2SeqForConditionalGeneration(config)


def build_marian(dims: TransformerDims, seed: int = 0):
    """`MarianMTModel` with our dimensions and special-token ids (post-norm, sinusoidal, ReLU,
    √d_model embedding scale, shared + tied embeddings), SDPA attention (the v5 default)."""
    import torch
    from transformers import MarianConfig, MarianMTModel

    torch.manual_seed(seed)
    config = MarianConfig(**shared_config_kwargs(dims), forced_eos_token_id=None)
    return MarianMTModel(config)


def count_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


# ----------------------------------------------------------------------------------------------
# Training steps
# ----------------------------------------------------------------------------------------------


def make_train_step(
    model,
    lr: float = 3e-4,
    fused: bool | None = None,
    zero_grad_set_to_none: bool = True,
    mixed_precision: str = "no",
    device: str = "cpu",
):
    """forward (sum of model loss) + backward + AdamW step + zero_grad on one batch.

    Both sides get the same step: the models' own `labels=` loss (mean over target tokens), the
    same AdamW (torch's default implementation for CPU tensors) and `zero_grad(set_to_none=True)`.
    `mixed_precision="bf16"` runs the forward under `torch.autocast(<device type>, torch.bfloat16)`,
    as Accelerate's `mixed_precision="bf16"` does (float32 weights and optimizer). `device`: the
    model is moved there; batches must already be there (`to_device`). The returned float of the
    loss waits for the step's kernels, so a host clock around `step` times finished work.
    """
    import contextlib

    import torch

    if mixed_precision not in ("no", "bf16"):
        raise ValueError(f"mixed_precision must be 'no' or 'bf16'; got {mixed_precision!r}")

    device_type = str(device).split(":")[0]
    model.to(device)
    model.train()
    kwargs = {"lr": lr, "betas": (0.9, 0.98), "eps": 1e-9, "weight_decay": 0.0}
    if fused is not None:
        kwargs["fused"] = fused
    optimizer = torch.optim.AdamW(model.parameters(), **kwargs)

    def autocast():
        if mixed_precision == "bf16":
            return torch.autocast(device_type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def step(batch: dict) -> float:
        with autocast():
            out = model(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                decoder_input_ids=batch["decoder_input_ids"],
                labels=batch["labels"],
            )
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=zero_grad_set_to_none)
        return float(out.loss.detach())

    return step, optimizer


# ----------------------------------------------------------------------------------------------
# JoeyNMT
# ----------------------------------------------------------------------------------------------


def sort_by_source_length(batch: dict) -> dict:
    """Rows reordered longest source first (JoeyNMT's packed encoder needs it; the work is the same)."""
    order = batch["attention_mask"].sum(1).argsort(descending=True, stable=True)
    return {k: v[order] for k, v in batch.items()}


class JoeyWorker:
    """The JoeyNMT side: a subprocess in .venv-joeynmt speaking the line protocol of joeynmt_worker.py."""

    def __init__(
        self, spec: dict, batches_path: Path, workdir: Path, name: str = "joeynmt", python: Path = JOEYNMT_PYTHON
    ):
        spec_path = workdir / f"spec_{spec['attention']}_{name}.json"
        spec_path.write_text(json.dumps(spec))
        self.stderr_path = workdir / f"worker_{spec['attention']}_{name}.stderr"
        with open(self.stderr_path, "w") as stderr:
            self.proc = subprocess.Popen(
                [str(python), str(JOEYNMT_WORKER), str(spec_path), str(batches_path)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        self.info = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=30)
            tail = self.stderr_path.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
            raise RuntimeError(
                f"JoeyNMT worker exited (code {self.proc.poll()}): {tail[0]} (whole log: {self.stderr_path})"
            )
        return json.loads(line)

    def ask(self, command: str) -> dict:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        self.proc.wait(timeout=30)
