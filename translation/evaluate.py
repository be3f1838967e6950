"""What the ``evaluate`` command computes and writes, as library calls: read a test set, translate
it with the one engine, score it (sacreBLEU BLEU / chrF / TER, translation/scores.py), and record
the result in a JSON file or in a training run's ``metrics.json`` (layout: docs/DESIGN.md).
Training's validation and test scores come from :func:`evaluate_model` too, so ``metrics.json``
and ``evaluate`` decode a model the same way, line for line.

    from attention_seq2seq.translation.evaluate import evaluate_model
    result, hypotheses = evaluate_model(loaded, sources, references, target_lang="en", num_beams=5)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..common.errors import UserError
from .loading import LoadedModel, translate
from .scores import corpus_scores, format_score


@dataclass
class TestSet:
    """Line-aligned sources and references, with what the results record of them."""

    name: str  # the results' key: from the corpus and split, or the --src file
    sources: list[str]
    references: list[str]
    target_lang: str | None  # zh/ja/ko switch BLEU's tokenizer
    split: str  # the corpus split, or "files"
    source: str  # where the sources came from: the corpus spec or the --src file
    reference: str


def read_test_set(
    *,
    corpus: str | None = None,
    split: str = "test",
    src: str | None = None,
    ref: str | None = None,
    name: str | None = None,
    target_lang: str | None = None,
    limit: int | None = None,
) -> TestSet:
    """A corpus spec's ``split``, or the line-aligned files ``src`` and ``ref``; the first ``limit``
    pairs. ``name`` defaults to ``<corpus name>-<split>`` or the stem of ``src``, ``target_lang`` to
    the corpus's or the suffix of ``ref``.

    Raises:
        UserError: both or neither of ``corpus`` and ``src``/``ref``, a file that cannot be read,
            ``src`` and ``ref`` of different lengths, or an empty test set.
    """
    if corpus and (src or ref):
        raise UserError("give --corpus (with --split) or --src and --ref, not both")
    if not (corpus or (src and ref)):
        raise UserError("the test set needs --corpus SPEC (with --split) or both --src FILE and --ref FILE")
    if corpus:
        from ..data import load_corpus

        splits, info = load_corpus(corpus, return_info=True)
        dataset = splits[split]
        sources, references = list(dataset["source"]), list(dataset["target"])
        name = name or f"{info.name}-{split}".replace(" ", "-")
        target_lang = target_lang or info.target_lang
        origin = (split, corpus, corpus)
    else:
        from ..data.spec import text_lines
        from ..common.user_files import check_input_file

        # UTF-8 checked (file and line named), BOM and CRLF dropped
        sources, references = (list(text_lines(check_input_file(f, o))) for f, o in ((src, "--src"), (ref, "--ref")))
        if len(sources) != len(references):
            raise UserError(f"--src has {len(sources)} lines but --ref has {len(references)}: {src}, {ref}")
        name = name or Path(src).stem
        target_lang = target_lang or (Path(ref).suffix.lstrip(".") or None)
        origin = ("files", str(src), str(ref))
    if limit:
        sources, references = sources[:limit], references[:limit]
    if not sources:
        raise UserError("the test set is empty")
    return TestSet(name, sources, references, target_lang, *origin)


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
    rank: int = 0,
    world_size: int = 1,
    **generate_kwargs,
) -> tuple[dict, list[str]]:
    """(result, hypotheses): the test set's scores and the decoding settings that produced them.

    ``result`` holds ``num_sentences``, ``num_beams``, ``max_new_tokens`` and ``length_penalty``
    (the ones given, else the model's ``generation_config``), then `corpus_scores`' keys (BLEU,
    lower-cased BLEU, chrF, TER, their signatures, and with ``n_bootstrap`` > 1 their 95%
    half-widths). ``target_lang`` zh/ja/ko switches BLEU's tokenizer. ``rank`` / ``world_size``:
    the processes of an Accelerate group share the batches and all return the whole result
    (`translate_n_best`).
    """
    hypotheses = translate(
        loaded,
        sources,
        batch_size=batch_size,
        max_batch_tokens=max_batch_tokens,
        max_source_length=max_source_length,
        progress=progress,
        rank=rank,
        world_size=world_size,
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


def evaluate_test_set(loaded: LoadedModel, test_set: TestSet, *, model: str, **options) -> tuple[dict, list[str]]:
    """(result, hypotheses) of the ``evaluate`` command: :func:`evaluate_model` (which takes
    ``options``) on ``test_set``, the result naming the split, ``model`` (the -m values), an
    ensemble's weights, and where the sources and references came from."""
    scores, hypotheses = evaluate_model(
        loaded, test_set.sources, test_set.references, target_lang=test_set.target_lang, **options
    )
    weights = {"ensemble_weights": loaded.model.config.weights} if loaded.location.kind == "ensemble" else {}
    result = {"split": test_set.split, **scores, "model": model, **weights}
    return {**result, "source": test_set.source, "reference": test_set.reference}, hypotheses


def _write_json(path: Path, data: dict) -> None:
    """Write ``data`` as the whole of ``path`` (a crash or a full disk leaves the old file whole;
    a device or ``/dev/stdout`` is written to as it is): :func:`~attention_seq2seq.common.user_files.write_whole`."""
    from ..common.user_files import write_whole

    write_whole(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def write_evaluation(
    test_set: TestSet,
    result: dict,
    hypotheses: Sequence[str],
    *,
    output: str | Path | None = None,
    hypotheses_file: str | Path | None = None,
    per_sentence: str | Path | None = None,
    run_dir: Path | None = None,
) -> None:
    """Keep an evaluation: ``{test set name: result}`` as the JSON file ``output``, the
    translations as ``hypotheses_file`` (one a line), one TSV row of sentence scores per sentence
    as ``per_sentence`` (`write_sentence_scores`), and the result as ``metrics.json``'s
    ``test[name]`` in the training output folder ``run_dir`` (:func:`update_run_metrics`).

    Each file is written whole through a temporary file and a rename; a full disk is one line
    naming the file, which is as it was before
    (:class:`~attention_seq2seq.common.durability.DiskFullError`).
    """
    from ..common.durability import writing
    from ..common.user_files import write_whole
    from .scores import write_sentence_scores

    unchanged = "the file is as it was before this run"
    if output is not None:
        with writing(output, "the scores", kept=unchanged):
            _write_json(Path(output), {test_set.name: result})
    if hypotheses_file is not None:
        with writing(hypotheses_file, "the translations", kept=unchanged):
            write_whole(hypotheses_file, "".join(h + "\n" for h in hypotheses))
    if per_sentence is not None:
        with writing(per_sentence, "the sentence scores", kept=unchanged):
            write_sentence_scores(per_sentence, hypotheses, test_set.references, target_lang=test_set.target_lang)
    if run_dir is not None:
        with writing(run_dir / "metrics.json", "the scores"):
            update_run_metrics(run_dir, test_set.name, result)


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
