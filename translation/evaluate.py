"""What the ``evaluate`` command computes and writes, as library calls: translate a test set with
the one engine, score it (sacreBLEU BLEU / chrF / TER, translation/scores.py), and record the
result in a JSON file or in a training run's ``metrics.json`` (layout: docs/DESIGN.md).

    from attention_seq2seq.translation.evaluate import evaluate_model
    result, hypotheses = evaluate_model(loaded, sources, references, target_lang="en", num_beams=5)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from .loading import LoadedModel, translate
from .scores import corpus_scores, format_score


def evaluate_model(
    loaded: LoadedModel,
    sources: Sequence[str],
    references: Sequence[str],
    *,
    target_lang: str | None = None,
    n_bootstrap: int = 1,
    batch_size: int = 32,
    max_batch_tokens: int | None = None,
    max_source_length: int | None = None,
    progress: bool = False,
    **generate_kwargs,
) -> tuple[dict, list[str]]:
    """(result, hypotheses): the test set's scores and the decoding settings that produced them.

    ``result`` holds ``num_sentences``, ``num_beams``, ``max_new_tokens`` and ``length_penalty``
    (the ones given, else the model's ``generation_config``), then `corpus_scores`' keys (BLEU,
    lower-cased BLEU, chrF, TER, their signatures, and with ``n_bootstrap`` > 1 their 95%
    half-widths). ``target_lang`` zh/ja/ko switches BLEU's tokenizer.
    """
    hypotheses = translate(
        loaded,
        sources,
        batch_size=batch_size,
        max_batch_tokens=max_batch_tokens,
        max_source_length=max_source_length,
        progress=progress,
        **generate_kwargs,
    )
    scores = corpus_scores(hypotheses, list(references), target_lang=target_lang, n_bootstrap=n_bootstrap)
    config = loaded.model.generation_config
    result = {
        "num_sentences": len(sources),
        "num_beams": generate_kwargs.get("num_beams", config.num_beams or 1),
        "max_new_tokens": generate_kwargs.get("max_new_tokens", config.max_new_tokens),
        "length_penalty": generate_kwargs.get(
            "length_penalty", 1.0 if config.length_penalty is None else config.length_penalty
        ),
        **scores,
    }
    return result, hypotheses


def _write_json(path: Path, data: dict) -> None:
    """Write ``data`` as the whole of ``path`` (a crash or a full disk leaves the old file whole;
    a device or ``/dev/stdout`` is written to as it is): :func:`~attention_seq2seq.common.user_files.write_whole`."""
    from ..common.user_files import write_whole

    write_whole(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def write_results(path: Path, results: dict[str, dict]) -> None:
    """``{test set name: result}`` as a JSON file (the evaluate command's ``--output``)."""
    _write_json(Path(path), results)


def update_run_metrics(run_dir: Path, name: str, result: dict) -> Path:
    """Record ``result`` as ``metrics.json``'s ``test[name]`` in the training output folder
    ``run_dir`` (everything else in the file is kept); returns the file."""
    metrics_file = Path(run_dir) / "metrics.json"
    metrics = json.loads(metrics_file.read_text(encoding="utf-8")) if metrics_file.is_file() else {}
    entry = {k: v for k, v in result.items() if k not in ("model", "source", "reference")}
    metrics.setdefault("test", {})[name] = entry
    _write_json(metrics_file, metrics)
    return metrics_file


def format_score_table(results: dict[str, dict]) -> str:
    """A plain-text table of test-set scores (score ± 95% half-width if bootstrapped), then the signatures."""
    with_ter = all("ter" in r for r in results.values())
    header = ("test set", "sentences", "beams", "BLEU", "chrF") + (("TER",) if with_ter else ())
    rows = [
        (name, str(r["num_sentences"]), str(r.get("num_beams", "-")), format_score(r, "bleu"), format_score(r, "chrf"))
        + ((format_score(r, "ter"),) if with_ter else ())
        for name, r in results.items()
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
        for row in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for name, r in results.items():
        lines.append(f"BLEU signature: {r['bleu_signature']}")
        lines.append(f"chrF signature: {r['chrf_signature']}")
        if with_ter:
            lines.append(f"TER signature: {r['ter_signature']} (lower is better)")
    return "\n".join(lines)
