"""Evaluation during and after training: validation / test scores, attention heat-maps, and the
run's ``metrics.json`` (layout: docs/DESIGN.md, "Training output folder")."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch

from ..common.user_files import write_whole
from ..data.pairs import Collate, eval_batches
from ..attention.sentences import attention_pass
from ..translation.evaluate import evaluate_model
from ..translation.loading import LoadedModel
from ..translation.scores import format_score
from ..attention.plotting import plot_cross_attentions
from .objectives import token_loss_sum

SCORE_KEYS = (
    "bleu",
    "bleu_lowercase",
    "chrf",
    "ter",
    "bleu_signature",
    "bleu_lowercase_signature",
    "chrf_signature",
    "ter_signature",
)
CI_KEYS = ("bleu_ci95", "bleu_lowercase_ci95", "chrf_ci95", "ter_ci95")


@torch.no_grad()
def evaluate(
    model, dataset, tokenizer, config, accelerator, num_beams: int, max_examples, target_lang, n_bootstrap: int = 1
) -> dict:
    """Teacher-forced loss / perplexity and BLEU / chrF / TER on (a prefix of) ``dataset``.

    The loss: over the tokenized pairs in length-sorted batches of ``config.eval_batch_size``,
    split over ranks; ``loss`` is the mean negative log-likelihood per target token (no label
    smoothing), ``perplexity`` its exp. The scores: of the raw sources' translations by the one
    engine (`translation.evaluate.evaluate_model`, ``num_beams`` beams, at most
    ``config.max_target_length`` new tokens, batches of ``config.eval_batch_size`` shared by the
    ranks), as ``attention-seq2seq evaluate`` translates and scores them; ``n_bootstrap`` > 1 adds
    each score's 95% confidence half-width. Every rank returns the same numbers.
    """
    was_training = model.training
    model.eval()
    nll, tokens = torch.zeros((), device=accelerator.device), torch.zeros((), device=accelerator.device)
    n = len(dataset) if max_examples is None else min(max_examples, len(dataset))
    batches = eval_batches(
        dataset["input_ids"][:n],
        dataset["labels"][:n],
        Collate(tokenizer.pad_token_id, tokenizer.bos_token_id),
        config.eval_batch_size,
        accelerator.process_index,
        accelerator.num_processes,
        accelerator.device,
    )
    for _, batch in batches:
        logits = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            decoder_input_ids=batch["decoder_input_ids"],
        ).logits
        nll += token_loss_sum(logits, batch["labels"], 0.0)
        tokens += (batch["labels"] != -100).sum()
    totals = accelerator.reduce(torch.stack([nll, tokens]), reduction="sum").tolist()
    scores, hypotheses = evaluate_model(
        LoadedModel(model, tokenizer),
        dataset["source"][:n],
        dataset["target"][:n],  # the raw strings, not our tokenizer's round trip
        target_lang=target_lang,
        n_bootstrap=n_bootstrap,
        batch_size=config.eval_batch_size,
        rank=accelerator.process_index,
        world_size=accelerator.num_processes,
        num_beams=num_beams,
        max_new_tokens=config.max_target_length,
    )
    model.train(was_training)
    loss = totals[0] / max(1.0, totals[1])
    return {"loss": loss, "perplexity": math.exp(min(loss, 100.0)), **scores, "hypotheses": hypotheses}


def plot_attention(model, tokenizer, sources: list[str], out_dir: Path, prefix: str, config, device) -> None:
    """Translate each source greedily and write the cross-attention heat-maps of its translation
    (the teacher-forced attention pass, ``attention/sentences.py``) as ``<prefix>_<i>.png``.

    ``config`` gives ``max_source_length`` (sources are truncated to it) and ``max_target_length``
    (the generation limit). Writes nothing for a model without cross-attention (the RNN with
    ``attention="none"``). The model is in evaluation mode for the call and in its previous
    attention implementation and mode after."""
    was_training = model.training
    model.eval()
    generate_kwargs = {"num_beams": 1, "max_new_tokens": config.max_target_length}
    try:
        for i, text in enumerate(sources):
            sentence = attention_pass(
                model,
                tokenizer,
                [text],
                generate_kwargs=generate_kwargs,
                max_source_length=config.max_source_length,
                device=device,
            ).sentences[0]
            if sentence.cross is None:  # nothing to draw
                return
            layers = [a.float().cpu().numpy() for a in sentence.cross]  # (num_heads, tgt_len, src_len)
            plot_cross_attentions(layers, sentence.source_tokens, sentence.target_tokens, out_dir, f"{prefix}_{i}")
    finally:
        model.train(was_training)


def run_provenance(device) -> dict:
    """metrics.json's ``run`` section: what produced the run, so that a results row can name it.

    ``commit``: the package checkout's ``git rev-parse HEAD`` (None outside a git checkout, e.g. a
    pip install), ``dirty``: whether tracked files differed from it; ``package_version``; ``host``:
    the CPU's model name and its logical CPU count, and the GPU's name when training ran on one;
    library versions; ``command``: the process's arguments; ``started_utc``: now, ISO 8601.
    ``train`` calls it when a session starts (a resumed run records its last session's code) and
    adds ``finished_utc`` at the end.
    """
    import datetime
    import platform
    import subprocess
    import sys

    import transformers

    from importlib import metadata

    from .precision import cpu_name

    source = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(source), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    try:
        version = metadata.version("attention-seq2seq")
    except metadata.PackageNotFoundError:
        version = None
    device = torch.device(device)
    return {
        "commit": commit,
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")) if commit else None,
        "package_version": version,
        "host": {
            "cpu": cpu_name(),
            "logical_cpus": os.cpu_count(),
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "platform": platform.platform(),
        },
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        "command": [Path(sys.argv[0]).name, *sys.argv[1:]],
        "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def metrics_test_section(config, n_test: int, test: dict, greedy: dict | None) -> dict:
    """metrics.json's ``test`` section: ``"<corpus kind>-test"`` (beam) and, with ``test_greedy``,
    ``"<corpus kind>-test-greedy"``, each with its scores, signatures and (with
    ``test_bootstrap``) confidence intervals."""
    return {
        f"{config.corpus.split(':')[0]}-test{suffix}": {
            "split": "test",
            "num_sentences": n_test,
            "num_beams": beams,
            **({"length_penalty": config.length_penalty} if beams > 1 else {}),
            **{k: result[k] for k in SCORE_KEYS},
            **{k: result[k] for k in CI_KEYS if k in result},  # with test_bootstrap
            "loss": result["loss"],
        }
        for suffix, beams, result in [("", config.test_num_beams, test), ("-greedy", 1, greedy)]
        if result is not None
    }


def write_run_report(output_dir: Path, metrics: dict, test: dict, greedy: dict | None, num_beams: int, logger) -> None:
    """Write ``metrics.json``, ``test_translations.txt`` (the beam output behind the test scores,
    one line per test sentence) and, with greedy scores, ``test_translations_greedy.txt``; log the
    test scores."""
    (output_dir / "test_translations.txt").write_text("".join(h + "\n" for h in test["hypotheses"]), encoding="utf-8")
    if greedy is not None:
        (output_dir / "test_translations_greedy.txt").write_text(
            "".join(h + "\n" for h in greedy["hypotheses"]), encoding="utf-8"
        )
    # metrics.json last, whole or absent: its presence says the run finished.
    write_whole(output_dir / "metrics.json", json.dumps(metrics, indent=2, ensure_ascii=False))
    logger.info(
        "test (beam %d): BLEU %s, lower-cased BLEU %s, chrF %s (%s)",
        num_beams,
        format_score(test, "bleu"),
        format_score(test, "bleu_lowercase"),
        format_score(test, "chrf"),
        test["bleu_signature"],
    )
    if greedy is not None:
        logger.info(
            "test (greedy): BLEU %s, lower-cased BLEU %s, chrF %s (%s)",
            format_score(greedy, "bleu"),
            format_score(greedy, "bleu_lowercase"),
            format_score(greedy, "chrf"),
            greedy["bleu_signature"],
        )
