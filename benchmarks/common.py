"""Shared pieces of the benchmarks: corpus, tokenizer, identical batches, the two Transformer
sides built with the same dimensions, interleaved timing, tables and JSON results.

Every benchmark compares our model with the peer a user would pick instead, in the same process
where possible, with both sides interleaved (A B B A ...) so that drifting machine load hits both
equally. Numbers are medians over repeats with the spread given as the inter-quartile range.
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
# BENCH_RESULTS_DIR puts the JSON elsewhere (scripts/gpu_check.sh: under its own output folder),
# so a device check never replaces the reference CPU measurements in benchmarks/results/.
RESULTS_DIR = Path(os.environ.get("BENCH_RESULTS_DIR") or Path(__file__).resolve().parent / "results")
DEFAULT_THREADS = 2

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


# ----------------------------------------------------------------------------------------------
# Machine and threads
# ----------------------------------------------------------------------------------------------


def set_threads(num_threads: int = DEFAULT_THREADS) -> int:
    """Fix torch's intra-op threads (and one inter-op thread) so both sides run alike."""
    import torch

    torch.set_num_threads(num_threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set in this process
        pass
    return torch.get_num_threads()


def resolve_device(name: str) -> str:
    """'cpu', 'cuda' or 'auto' (cuda when torch sees a GPU, else cpu) -> a torch device string.

    Asking for 'cuda' where torch sees none ends the benchmark with one line (SystemExit), not a
    traceback from the first tensor moved there.
    """
    import torch

    if name not in ("cpu", "cuda", "auto"):
        raise SystemExit(f"--device must be one of 'auto', 'cpu', 'cuda'; got {name!r}")
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            f"--device cuda: torch {torch.__version__} sees no CUDA device on this machine "
            "(use --device cpu, or run on a GPU machine)"
        )
    return name


def sync(device: str) -> None:
    """Wait for the device's queued kernels, so a host clock read after it times finished work."""
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def to_device(batch: dict, device: str) -> dict:
    return {k: v.to(device) for k, v in batch.items()}


def _seeded_randn(device: str, dtype):
    """randn(*shape) of a seeded generator, in `dtype` on `device`: drawn on the CPU and moved for
    a CPU (the numbers every earlier CPU measurement used), drawn on the GPU itself for a GPU (a
    CPU draw of a 16k x 8k tensor would cost the GPU check seconds per batch)."""
    import torch

    if str(device).startswith("cpu"):
        gen = torch.Generator().manual_seed(0)
        return lambda *shape: torch.randn(*shape, generator=gen).to(device, dtype)
    gen = torch.Generator(device=device).manual_seed(0)
    return lambda *shape: torch.randn(*shape, generator=gen, device=device, dtype=dtype)


def peak_matmul_flops_per_s(device: str = "cpu", dtype=None, n: int = 8192, repeats: int = 10) -> dict:
    """The device's measured matmul peak: FLOP/s of an n x n x n product (2 n^3 FLOPs), the mean
    of `repeats` timed products after three warm-ups, on random data (zeros run faster on some
    GPUs). On the H200 an 8192^3 bf16 product gives about 790 TFLOP/s. MFU against this peak says
    how much of the chip a training step uses; MFU against `matmul_reference_flops_per_s` says how
    close it gets to its own (smaller) GEMM shapes.
    """
    import torch

    dtype = dtype or torch.float32
    randn = _seeded_randn(device, dtype)
    a, b = randn(n, n), randn(n, n)
    for _ in range(3):
        torch.matmul(a, b)
    sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        torch.matmul(a, b)
    sync(device)
    seconds = time.perf_counter() - start
    return {
        "flops_per_s": 2.0 * n**3 * repeats / seconds,
        "n": n,
        "repeats": repeats,
        "dtype": str(dtype).replace("torch.", ""),
    }


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict:
    import torch
    import transformers

    info = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu_model": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": "cuda:" + torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "load_avg_1min": os.getloadavg()[0],
    }
    return info


# ----------------------------------------------------------------------------------------------
# Corpus and tokenizer
# ----------------------------------------------------------------------------------------------


def multi30k_dir() -> Path:
    env = os.environ.get("ATTN_SEQ2SEQ_SHARED_DATA")
    root = Path(env) if env else REPO_ROOT.parent / "shared" / "data"
    return root / "multi30k"


def read_pairs(split: str = "train", limit: int | None = None) -> list[tuple[str, str]]:
    """(German source, English target) pairs of a Multi30k split, read in place (never copied)."""
    root = multi30k_dir()
    with open(root / f"{split}.de", encoding="utf-8") as f_de, open(root / f"{split}.en", encoding="utf-8") as f_en:
        pairs = [(de.rstrip("\n"), en.rstrip("\n")) for de, en in zip(f_de, f_en)]
    return pairs[:limit] if limit else pairs


def test2016_translation_setup(dims) -> tuple:
    """Benchmark 3's inputs: (tokenizer, test2016 sources, new tokens per sentence), where the number
    of new tokens is the mean test2016 reference length in pieces, rounded up (each side decodes
    exactly that many, with no `</s>`)."""
    import math

    tokenizer = build_tokenizer(dims.vocab_size)
    pairs = read_pairs("test2016")
    ref_lengths = [len(ids) for ids in tokenizer([t for _, t in pairs])["input_ids"]]
    return tokenizer, [s for s, _ in pairs], math.ceil(sum(ref_lengths) / len(ref_lengths))


def build_tokenizer(vocab_size: int = 8000, cache_dir: Path | None = None):
    """A joint de+en tokenizer trained on Multi30k train, with the package's special-token ids.

    Uses the data layer's `train_tokenizer` when it is importable; otherwise trains a unigram model
    with `tokenizers` directly (pad 0, <s> 1, </s> 2, unk 3; `</s>` appended to every sequence).
    Either way the result is a `PreTrainedTokenizerFast`, cached on disk so every subprocess and
    both sides of a benchmark see exactly the same vocabulary.
    """
    from transformers import PreTrainedTokenizerFast

    # BENCH_TOKENIZER_PAIRS=N trains on the first N pairs only (scripts/gpu_check.sh --dry-run: a
    # rehearsal whose figures mean nothing need not spend a minute on the full corpus).
    limit = int(os.environ.get("BENCH_TOKENIZER_PAIRS", 0)) or None
    name = f"tok{vocab_size}" + (f"_first{limit}" if limit else "")
    cache_dir = cache_dir or Path(os.environ.get("BENCH_CACHE", "/tmp/attention_seq2seq_bench")) / name
    if (cache_dir / "tokenizer.json").exists():
        return PreTrainedTokenizerFast.from_pretrained(str(cache_dir))
    pairs = read_pairs("train", limit)
    tokenizer = None
    try:
        from attention_seq2seq.data import train_tokenizer  # the data layer, when present
        import datasets

        train = datasets.Dataset.from_dict({"source": [s for s, _ in pairs], "target": [t for _, t in pairs]})
        dataset = datasets.DatasetDict({"train": train})
        try:
            tokenizer = train_tokenizer(dataset, vocab_size=vocab_size, model_type="unigram")
        except Exception:  # noqa: BLE001 - the signature may want the split itself
            tokenizer = train_tokenizer(train, vocab_size=vocab_size, model_type="unigram")
        tokenizer.init_kwargs["bench_source"] = "attention_seq2seq.data.train_tokenizer"
    except ImportError:
        tokenizer = _train_unigram_directly(pairs, vocab_size)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(cache_dir))
    return PreTrainedTokenizerFast.from_pretrained(str(cache_dir))


def _train_unigram_directly(pairs, vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=specials, unk_token="<unk>")
    tok.train_from_iterator((text for pair in pairs for text in pair), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def tokenize_pairs(tokenizer, pairs) -> tuple[list[list[int]], list[list[int]]]:
    src = tokenizer([s for s, _ in pairs], add_special_tokens=True)["input_ids"]
    tgt = tokenizer([t for _, t in pairs], add_special_tokens=True)["input_ids"]
    return src, tgt


# ----------------------------------------------------------------------------------------------
# Identical batches
# ----------------------------------------------------------------------------------------------


def token_budget_batches(src_ids, tgt_ids, max_tokens: int, seed: int = 0) -> list[list[int]]:
    """Indices of length-bucketed batches whose padded size max(src, tgt) x batch <= max_tokens.

    Independent of the data layer so the batches (and therefore the work) are fixed across
    versions of the package; the pipeline benchmark uses the data layer's own sampler instead.
    """
    order = sorted(range(len(src_ids)), key=lambda i: (len(tgt_ids[i]), len(src_ids[i]), i))
    batches, current, longest = [], [], 0
    for i in order:
        length = max(len(src_ids[i]), len(tgt_ids[i]))
        if current and max(longest, length) * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, length)
    if current:
        batches.append(current)
    random.Random(seed).shuffle(batches)
    return batches


def collate(src_ids, tgt_ids, indices, pad_id: int = 0, decoder_start_id: int = 1) -> dict:
    """Right-padded `input_ids`, `attention_mask`, `labels` (-100 on padding), `decoder_input_ids`."""
    import torch

    srcs = [src_ids[i] for i in indices]
    tgts = [tgt_ids[i] for i in indices]
    s_len, t_len = max(map(len, srcs)), max(map(len, tgts))
    input_ids = torch.full((len(srcs), s_len), pad_id, dtype=torch.long)
    labels = torch.full((len(tgts), t_len), -100, dtype=torch.long)
    for row, (s, t) in enumerate(zip(srcs, tgts)):
        input_ids[row, : len(s)] = torch.tensor(s)
        labels[row, : len(t)] = torch.tensor(t)
    decoder_input_ids = torch.full_like(labels, pad_id)
    decoder_input_ids[:, 0] = decoder_start_id
    shifted = labels[:, :-1]
    decoder_input_ids[:, 1:] = shifted.masked_fill(shifted == -100, pad_id)  # shift right, -100 -> pad
    return {
        "input_ids": input_ids,
        "attention_mask": (input_ids != pad_id).long(),
        "decoder_input_ids": decoder_input_ids,
        "decoder_attention_mask": (decoder_input_ids != pad_id).long().index_fill_(1, torch.tensor([0]), 1),
        "labels": labels,
    }


def batch_stats(batch: dict) -> dict:
    labels = batch["labels"]
    return {
        "batch_size": int(labels.shape[0]),
        "src_len": int(batch["input_ids"].shape[1]),
        "tgt_len": int(labels.shape[1]),
        "tgt_tokens": int((labels != -100).sum()),
        "src_tokens": int(batch["attention_mask"].sum()),
        "tgt_padded": int(labels.numel()),
        "src_padded": int(batch["input_ids"].numel()),
    }


def load_batches(max_tokens: int, count: int, vocab_size: int = 8000, seed: int = 0, split: str = "train"):
    """`count` identical-for-both-sides training batches of at most `max_tokens` padded tokens."""
    tokenizer = build_tokenizer(vocab_size)
    pairs = read_pairs(split)
    src, tgt = tokenize_pairs(tokenizer, pairs)
    indices = token_budget_batches(src, tgt, max_tokens, seed)
    # Keep full-size batches only (the tail of a length bucket can be tiny).
    sizes = sorted(len(b) * max(max(len(src[i]), len(tgt[i])) for i in b) for b in indices)
    floor = sizes[len(sizes) // 4]
    chosen = [b for b in indices if len(b) * max(max(len(src[i]), len(tgt[i])) for i in b) >= floor][:count]
    return tokenizer, [collate(src, tgt, b) for b in chosen]


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


def transformer_train_flops(dims: TransformerDims, stats: dict) -> float:
    """Training FLOPs of one step (forward + backward) counted from the dimensions.

    Multiply-adds count 2 FLOPs; backward costs twice the forward (grads w.r.t. inputs and
    weights), so a step is 3 x forward. Work is counted on the padded shapes the batch hands to
    the model (B x S source positions, B x T target positions), identical for both sides.

    forward, per layer (d = d_model, f = ffn):
      encoder self-attention projections   2 * B*S * 4*d^2        (q, k, v, out)
      encoder self-attention scores + mix  2 * 2 * B * S*S * d
      encoder feed-forward                 2 * B*S * 2*d*f
      decoder self-attention projections   2 * B*T * 4*d^2
      decoder causal scores + mix          2 * 2 * B * T*T * d    (full square: SDPA computes it)
      decoder cross-attention projections  2 * (B*T * 2*d^2 + B*S * 2*d^2)   (q, out; k, v)
      decoder cross scores + mix           2 * 2 * B * T*S * d
      decoder feed-forward                 2 * B*T * 2*d*f
    plus the output projection             2 * B*T * d*V
    Embedding look-ups, norms, softmax and the loss are left out (not matmuls).
    """
    d, f, V, L = dims.d_model, dims.ffn, dims.vocab_size, dims.layers
    B, S, T = stats["batch_size"], stats["src_len"], stats["tgt_len"]
    enc = L * (2 * B * S * 4 * d * d + 4 * B * S * S * d + 2 * B * S * 2 * d * f)
    dec = L * (
        2 * B * T * 4 * d * d
        + 4 * B * T * T * d
        + 2 * (B * T * 2 * d * d + B * S * 2 * d * d)
        + 4 * B * T * S * d
        + 2 * B * T * 2 * d * f
    )
    head = 2 * B * T * d * V
    return 3.0 * (enc + dec + head)


def matmul_reference_flops_per_s(
    dims: TransformerDims, stats: dict, repeats: int = 3, dtype=None, device: str = "cpu"
) -> dict:
    """FLOP/s torch.matmul reaches on the model's own GEMM shapes, forward and backward.

    For every linear layer of the model (M tokens x K in -> N out) we time the three GEMMs of its
    training step: Y = X W^T (M,K)x(K,N), dX = dY W (M,N)x(N,K), dW = dY^T X (N,M)x(M,K), each as
    many times as the model has such layers. The reference is total FLOPs / total time, i.e. what
    a perfect implementation built only from these matmuls would reach; MFU divides the model's
    achieved FLOP/s by it. The attention score/mix batched GEMMs are included the same way.
    `dtype` (default float32): torch.bfloat16 gives the reference of a bf16 mixed-precision step.
    `device`: where the products run (each group of them is timed between two synchronisations).
    """
    import torch

    dtype = dtype or torch.float32

    d, f, V, L, H = dims.d_model, dims.ffn, dims.vocab_size, dims.layers, dims.heads
    B, S, T = stats["batch_size"], stats["src_len"], stats["tgt_len"]
    hd = d // H
    shapes = [  # (count, M, K, N)
        (L * 4, B * S, d, d),
        (L, B * S, d, f),
        (L, B * S, f, d),  # encoder
        (L * 4, B * T, d, d),
        (L, B * T, d, f),
        (L, B * T, f, d),  # decoder self-attn + ffn
        (L * 2, B * T, d, d),
        (L * 2, B * S, d, d),  # cross-attention q/out and k/v
        (1, B * T, d, V),  # output projection
    ]
    bmm_shapes = [  # (count, batch, M, K, N): scores Q K^T and mix P V
        (L, B * H, S, hd, S),
        (L, B * H, S, S, hd),
        (L, B * H, T, hd, T),
        (L, B * H, T, T, hd),
        (L, B * H, T, hd, S),
        (L, B * H, T, S, hd),
    ]
    randn = _seeded_randn(device, dtype)
    ops = []
    for count, M, K, N in shapes:
        x, w, dy = randn(M, K), randn(N, K), randn(M, N)
        ops.append((count, 2.0 * M * K * N, lambda x=x, w=w: torch.matmul(x, w.t())))
        ops.append((count, 2.0 * M * K * N, lambda dy=dy, w=w: torch.matmul(dy, w)))
        ops.append((count, 2.0 * M * K * N, lambda dy=dy, x=x: torch.matmul(dy.t(), x)))
    for count, Bh, M, K, N in bmm_shapes:
        a, b, g = randn(Bh, M, K), randn(Bh, K, N), randn(Bh, M, N)
        ops.append((count, 2.0 * Bh * M * K * N, lambda a=a, b=b: torch.matmul(a, b)))
        ops.append((count, 2.0 * Bh * M * K * N, lambda g=g, b=b: torch.matmul(g, b.transpose(1, 2))))
        ops.append((count, 2.0 * Bh * M * K * N, lambda a=a, g=g: torch.matmul(a.transpose(1, 2), g)))
    for _, _, op in ops:  # warm-up
        op()
    sync(device)
    samples, flops_total, seconds_total = [], 0.0, 0.0
    for _ in range(repeats):
        total_flops, total_time = 0.0, 0.0
        for count, flops, op in ops:
            start = time.perf_counter()
            for _ in range(count):
                op()
            sync(device)
            total_time += time.perf_counter() - start
            total_flops += count * flops
        samples.append(total_flops / total_time)
        flops_total += total_flops
        seconds_total += total_time
    return {
        "flops_per_s": statistics.median(samples),
        "samples": samples,
        "flops": flops_total,
        "seconds": seconds_total,
    }


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
# Timing
# ----------------------------------------------------------------------------------------------


def summarize(values: list[float]) -> dict:
    """Median, inter-quartile range, min and max of a list of samples."""
    vals = sorted(values)
    if len(vals) >= 4:
        q = statistics.quantiles(vals, n=4)
        q1, q3 = q[0], q[2]
    else:
        q1, q3 = vals[0], vals[-1]
    return {"median": statistics.median(vals), "q1": q1, "q3": q3, "min": vals[0], "max": vals[-1], "n": len(vals)}


def paired_ratio_summary(ours_rates: list[float], peer_rates: list[float]) -> dict:
    """Ratios of rates paired round by round (robust to load drifting between rounds)."""
    return summarize([a / b for a, b in zip(ours_rates, peer_rates)])


# ----------------------------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------------------------


def fmt(x: float, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if abs(x) >= 1e6:
        return f"{x / 1e6:.{digits}f}M"
    if abs(x) >= 1e4:
        return f"{x / 1e3:.{digits}f}k"
    return f"{x:.{digits}f}"


def spread(s: dict, digits: int = 1) -> str:
    return f"[{fmt(s['q1'], digits)} – {fmt(s['q3'], digits)}]"


def print_table(title: str, header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    text = "\n".join(
        [f"\n{title}", line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in rows]
    )
    print(text, flush=True)
    return text


def goal_entry(name: str, ratio: float, goal: float, higher_is_better: bool = True, note: str = "") -> dict:
    met = ratio >= goal if higher_is_better else ratio <= goal
    return {
        "metric": name,
        "ratio": ratio,
        "goal": goal,
        "direction": ">=" if higher_is_better else "<=",
        "met": bool(met),
        "note": note,
    }


def write_result(name: str, payload: dict, quick: bool) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": name, "quick": quick, "machine": machine_info(), **payload}
    path = RESULTS_DIR / (f"{name}{'_quick' if quick else ''}.json")
    path.write_text(json.dumps(payload, indent=2, default=_json_default) + "\n")
    shown = path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path
    print(f"[bench] wrote {shown}", flush=True)
    return path


def _json_default(obj):
    if hasattr(obj, "__dataclass_fields__"):
        return asdict(obj)
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)


def base_argparser(description: str):
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="few repeats: a smoke test of the harness")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("BENCH_THREADS", DEFAULT_THREADS)))
    parser.add_argument(
        "--device",
        default=os.environ.get("BENCH_DEVICE", "cpu"),
        choices=("auto", "cpu", "cuda"),
        help="where both sides run (default cpu; auto: cuda when torch sees a GPU)",
    )
    return parser


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
