"""JoeyNMT side of the RNN benchmark; runs inside the separate JoeyNMT venv (.venv-joeynmt).

Started by `bench_rnn.py` as a long-lived subprocess so that both sides can be interleaved round
by round. Imports only the standard library, torch and joeynmt (not our package).

    .venv-joeynmt/bin/python benchmarks/joeynmt_worker.py SPEC.json BATCHES.pt

SPEC.json: {"attention": "luong"|"bahdanau", "rnn_type", "embedding_size", "encoder_hidden_size",
"hidden_size", "layers", "dropout", "vocab_size", "threads", "lr", "autocast", "device"}; "device" (default
"cpu"): where model and batches live, "cuda" for the GPU; "autocast": "bf16" runs
the forward under `torch.autocast(<device type>, torch.bfloat16)`, which JoeyNMT 2.3 itself cannot be told
to do (on a CPU it turns its `fp16` switch off; its config carries "TODO: torch.bfloat16 for
cpu?"): the like-for-like partner of our bf16 step. BATCHES.pt: a list of dicts of
int64 tensors `input_ids`, `labels` (-100 on padding) and `decoder_input_ids` in the package's id
convention (pad 0, <s> 1, </s> 2, unk 3), already sorted by source length, longest first (JoeyNMT's
encoder packs sequences and needs that order).

Protocol (one JSON object per line on stdout):
    start                   -> {"ready": true, "params": N, "torch": ..., "joeynmt": ...}
    stdin "warmup K"        -> runs K steps,               {"ok": true}
    stdin "step I"          -> batch I once, timed,         {"seconds": s, "loss": loss}
    stdin "round"           -> every batch once, timed,     {"seconds": s, "loss": mean loss}
    stdin "quit"            -> exits
One step: model(return_type="loss") (summed cross-entropy over non-pad targets, JoeyNMT's own
loss), divided by the number of target tokens (JoeyNMT's `normalization: tokens`), backward,
AdamW step (same hyperparameters as our side), zero_grad.
"""

from __future__ import annotations

import json
import sys
import time
from types import SimpleNamespace


def remap_ids(ids, pad_joey: int):
    """Our ids -> JoeyNMT's: its specials come in the order unk 0, pad 1, bos 2, eos 3, ours are
    pad 0, <s> 1, </s> 2, unk 3; every other id is the same piece."""
    import torch

    table = torch.arange(max(4, int(ids.max()) + 1))
    table[:4] = torch.tensor([pad_joey, 2, 3, 0])
    return table[ids]


def build(spec: dict):
    import torch
    from joeynmt.model import build_model
    from joeynmt.vocabulary import Vocabulary

    special = SimpleNamespace(
        unk_token="<unk>",
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_id=0,
        pad_id=1,
        bos_id=2,
        eos_id=3,
        sep_token=None,
        lang_tags=[],
    )
    vocab = Vocabulary([f"piece{i}" for i in range(spec["vocab_size"] - 4)], special)
    assert len(vocab) == spec["vocab_size"], len(vocab)
    dropout = spec["dropout"]
    cfg = {
        "tied_embeddings": True,  # one joint vocabulary: source and target share the embedding
        "tied_softmax": False,
        "initializer": "xavier_uniform",
        "encoder": {
            "type": "recurrent",
            "rnn_type": spec["rnn_type"],
            "embeddings": {"embedding_dim": spec["embedding_size"], "dropout": dropout},
            "hidden_size": spec["encoder_hidden_size"],
            "bidirectional": True,
            "num_layers": spec["layers"],
            "dropout": dropout,
        },
        "decoder": {
            "type": "recurrent",
            "rnn_type": spec["rnn_type"],
            "embeddings": {"embedding_dim": spec["embedding_size"], "dropout": dropout},
            "hidden_size": spec["hidden_size"],
            "attention": spec["attention"],
            "input_feeding": True,
            "init_hidden": "bridge",
            "num_layers": spec["layers"],
            "dropout": dropout,
            "hidden_dropout": dropout,
        },
    }
    torch.manual_seed(0)
    model = build_model(cfg, src_vocab=vocab, trg_vocab=vocab)
    model.loss_function = ("crossentropy", 0.0)
    return model, vocab.pad_index


def to_joey_batch(batch: dict, pad: int) -> dict:
    labels = batch["labels"].masked_fill(batch["labels"] == -100, 0)
    src = remap_ids(batch["input_ids"], pad)
    trg = remap_ids(labels, pad)
    trg_input = remap_ids(batch["decoder_input_ids"], pad)
    return {
        "src": src,
        "src_length": (src != pad).sum(1),
        "src_mask": (src != pad).unsqueeze(1),
        "trg": trg,
        "trg_input": trg_input,
        "trg_mask": (trg != pad).unsqueeze(1),
        "ntokens": int((trg != pad).sum()),
    }


def main() -> None:
    import torch

    spec = json.loads(open(sys.argv[1]).read())
    torch.set_num_threads(spec.get("threads", 2))
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    device = spec.get("device", "cpu")
    model, pad = build(spec)
    model.to(device)
    model.train()
    batches = [
        {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in to_joey_batch(b, pad).items()}
        for b in torch.load(sys.argv[2])
    ]
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=spec.get("lr", 3e-4), betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0
    )

    import contextlib

    bf16 = spec.get("autocast") == "bf16"

    def step(batch: dict) -> float:
        ntokens = batch["ntokens"]
        kwargs = {k: v for k, v in batch.items() if k != "ntokens"}
        with torch.autocast(device.split(":")[0], dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            batch_loss, _, _, _ = model(return_type="loss", **kwargs)
        loss = batch_loss / ntokens
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.startswith("cuda"):  # the step's time ends when its kernels have run
            torch.cuda.synchronize()
        return float(loss.detach())

    import joeynmt

    print(
        json.dumps(
            {
                "ready": True,
                "params": sum(p.numel() for p in model.parameters()),
                "torch": torch.__version__,
                "joeynmt": getattr(joeynmt, "__version__", "?"),
            }
        ),
        flush=True,
    )
    done = 0
    for line in sys.stdin:
        command = line.split()
        if not command:
            continue
        if command[0] == "quit":
            break
        if command[0] == "warmup":
            for i in range(int(command[1])):
                step(batches[(done + i) % len(batches)])
            done += int(command[1])
            print(json.dumps({"ok": True}), flush=True)
        elif command[0] == "step":
            batch = batches[int(command[1]) % len(batches)]
            start = time.perf_counter()
            loss = step(batch)
            print(json.dumps({"seconds": time.perf_counter() - start, "loss": loss}), flush=True)
        elif command[0] == "round":
            start = time.perf_counter()
            losses = [step(b) for b in batches]
            seconds = time.perf_counter() - start
            print(json.dumps({"seconds": seconds, "loss": sum(losses) / len(losses)}), flush=True)
        else:
            print(json.dumps({"error": f"unknown command {command[0]!r}"}), flush=True)


if __name__ == "__main__":
    main()
