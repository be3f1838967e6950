"""Ensembles and terminology constraints on the main job's models (issue 41): test BLEU of each
member and of their ensembles, BLEU with constraints drawn from the references against without,
and what each costs in speed, paired against one model on the same sentences.

Run the main job first (``bash scripts/main_job.sh``, writing ``runs/main-job/runs/``) and a
second Transformer with another seed::

    accelerate launch --cpu -m attention_seq2seq.training.train \\
        --recipe training/recipes/main-job-bible-transformer-small.yaml --seed 2 \\
        --output_dir runs/main-job/runs/bible-transformer-small-seed2
    python benchmarks/bench_ensembles_constraints.py --runs runs/main-job/runs

Every translation goes through the package's own paths: ``translation.loading.translate`` (what
``evaluate`` runs) for BLEU, ``translation.files.translate_stream`` (what ``translate`` runs) for
the constraints. Beam 5, as the recipes' test (the constrained search also with ``--constraint-beams``).
A line whose unconstrained translation already holds every term but which the constrained search
changes is counted as a search error when the model (teacher-forced, log p / length^α) scores the
unconstrained line higher: the constrained search missed a hypothesis that met every constraint.
The terms: for each test line, the rule of
``tests/fixtures/bible-constraints`` (every fifth line none; the others the reference's longest
word of 5+ letters, even-numbered lines also its last one). Speed: median of paired rounds
(A B B A) of one model against the ensemble / the constrained search on the first ``--speed-lines``
test sentences; a ratio is ensemble (or constrained) sentences per second over one model's.
"""

from __future__ import annotations

import io
import time
from pathlib import Path

from harness.machine import base_argparser, log, set_threads
from harness.results import print_table, write_result
from harness.timing import paired_ratio_summary

PUNCTUATION = ".,;:!?\"'()[]«»“”‘’"


def terms_of(index: int, reference: str) -> list[str]:
    """The fixture's rule (tests/fixtures/bible-constraints/README.md) for 0-based line ``index``."""
    if index % 5 == 4:
        return []
    words = [w.strip(PUNCTUATION) for w in reference.split()]
    words = [w for w in words if len(w) >= 5 and w.isalpha()]
    if not words:
        return []
    picked = [max(words, key=len)]
    if index % 2 == 1 and words[-1] not in picked:
        picked.append(words[-1])
    return picked


def main() -> None:
    parser = base_argparser(__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=Path("runs/main-job/runs"))
    parser.add_argument("--num-beams", type=int, default=5)
    parser.add_argument("--speed-lines", type=int, default=120)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument(
        "--constraint-beams",
        default="5,10",
        help="beam sizes of the constrained search, comma-separated (the banks share the beam; default 5,10)",
    )
    args = parser.parse_args()
    set_threads(args.threads)

    from attention_seq2seq.data import load_corpus
    from attention_seq2seq.translation.files import FileTranslationOptions, translate_stream
    from attention_seq2seq.translation.loading import load_ensemble, load_for_inference, translate
    from attention_seq2seq.translation.scores import corpus_scores

    splits = load_corpus("bible:es-en")
    sources, references = list(splits["test"]["source"]), list(splits["test"]["target"])
    if args.quick:
        sources, references = sources[:40], references[:40]
    runs = {
        "Transformer": args.runs / "bible-transformer-small",
        "Transformer seed 2": args.runs / "bible-transformer-small-seed2",
        "RNN": args.runs / "bible-rnn-luong",
    }
    for name, path in runs.items():
        if not (path / "model" / "config.json").is_file():
            raise SystemExit(f"{name}: no training run at {path} (see this script's docstring)")
    models = {name: load_for_inference(path, device="cpu") for name, path in runs.items()}
    ensembles = {
        "Transformer + Transformer seed 2": ("Transformer", "Transformer seed 2"),
        "RNN + Transformer": ("RNN", "Transformer"),
    }
    for name, members in ensembles.items():
        models[name] = load_ensemble([runs[m] for m in members], device="cpu")
    kwargs = {"num_beams": args.num_beams}

    def run(name: str, lines) -> tuple[list[str], float]:
        start = time.perf_counter()
        out = translate(models[name], lines, **kwargs)
        return out, time.perf_counter() - start

    # 1. test BLEU of the members and the ensembles
    scores = {}
    for name in models:
        hypotheses, seconds = run(name, sources)
        s = corpus_scores(hypotheses, references, target_lang="en", n_bootstrap=1000)
        scores[name] = {"bleu": s["bleu"], "bleu_ci95": s["bleu_ci95"], "chrf": s["chrf"], "ter": s["ter"]}
        scores[name]["seconds"] = seconds
        log(f"{name}: BLEU {s['bleu']:.2f} ± {s['bleu_ci95']:.2f}, chrF {s['chrf']:.2f}, {seconds:.1f} s")

    # 2. constraints from the references, with the Transformer
    terms = [terms_of(i, r) for i, r in enumerate(references)]
    tokenizer = models["Transformer"].tokenizer
    constraint_ids = [[tokenizer(text_target=t, add_special_tokens=False)["input_ids"] for t in ts] for ts in terms]

    def constrained(name: str, lines, ids, beams: int = args.num_beams) -> tuple[list[str], float]:
        stream = io.StringIO()
        options = FileTranslationOptions(constraints=ids)
        start = time.perf_counter()
        translate_stream(models[name], lines, options=options, generate_kwargs={"num_beams": beams}, stream=stream)
        return stream.getvalue().split("\n")[:-1], time.perf_counter() - start

    def model_score(name: str, index: int, hypothesis: str) -> float:
        """log p(hypothesis | source) / length^α, teacher-forced on the re-tokenized hypothesis."""
        import torch

        loaded = models[name]
        alpha = loaded.model.generation_config.length_penalty
        alpha = 1.0 if alpha is None else alpha
        source = loaded.tokenizer(sources[index], return_tensors="pt", truncation=True)
        labels = loaded.tokenizer(text_target=hypothesis, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            log_probs = loaded.model(**source, labels=labels).logits.float().log_softmax(-1)
        return log_probs.gather(-1, labels.unsqueeze(-1)).sum().item() / labels.shape[1] ** alpha

    with_terms = {}
    for name, beams in [(n, int(b)) for n in ("Transformer", "RNN") for b in args.constraint_beams.split(",")]:
        hypotheses, seconds = constrained(name, sources, constraint_ids, beams)
        plain = scores[name]
        s = corpus_scores(hypotheses, references, target_lang="en")
        total = sum(map(len, terms))
        present = sum(t in h for ts, h in zip(terms, hypotheses) for t in ts)
        plain_out = translate(models[name], sources, num_beams=beams)
        unconstrained_lines = [i for i, ts in enumerate(terms) if not ts]
        same = sum(hypotheses[i] == plain_out[i] for i in unconstrained_lines)
        # Lines whose unconstrained output already has every term, yet the constrained search wrote
        # another line: a search error when the model scores the unconstrained line higher.
        changed = [
            i
            for i, ts in enumerate(terms)
            if ts and all(t in plain_out[i] for t in ts) and hypotheses[i] != plain_out[i]
        ]
        errors = sum(model_score(name, i, plain_out[i]) > model_score(name, i, hypotheses[i]) for i in changed)
        with_terms[f"{name}, beam {beams}"] = {
            "num_beams": beams,
            "bleu": s["bleu"],
            "chrf": s["chrf"],
            "ter": s["ter"],
            "bleu_without": plain["bleu"],
            "bleu_without_same_beam": corpus_scores(plain_out, references, target_lang="en")["bleu"],
            "terms": total,
            "terms_present": present,
            "terms_present_without": sum(t in h for ts, h in zip(terms, plain_out) for t in ts),
            "lines_without_terms": len(unconstrained_lines),
            "lines_without_terms_identical": same,
            "lines_with_all_terms_unconstrained": sum(
                bool(ts) and all(t in plain_out[i] for t in ts) for i, ts in enumerate(terms)
            ),
            "of_them_changed": len(changed),
            "of_them_search_errors": errors,
            "hypothesis_tokens": len(" ".join(hypotheses).split()),
            "hypothesis_tokens_without": len(" ".join(plain_out).split()),
            "seconds": seconds,
        }
        without = with_terms[f"{name}, beam {beams}"]["bleu_without_same_beam"]
        log(f"{name} with terms, beam {beams}: BLEU {s['bleu']:.2f} (without {without:.2f}); {present}/{total} terms")

    # 3. paired speed on the first speed-lines sentences
    lines = sources[: args.speed_lines]
    ids = constraint_ids[: args.speed_lines]
    pairs = {
        "Transformer + Transformer seed 2 vs Transformer": (
            lambda: run("Transformer", lines)[1],
            lambda: run("Transformer + Transformer seed 2", lines)[1],
        ),
        "RNN + Transformer vs Transformer": (
            lambda: run("Transformer", lines)[1],
            lambda: run("RNN + Transformer", lines)[1],
        ),
        "RNN + Transformer vs RNN": (lambda: run("RNN", lines)[1], lambda: run("RNN + Transformer", lines)[1]),
        "Transformer with terms vs without": (
            lambda: run("Transformer", lines)[1],
            lambda: constrained("Transformer", lines, ids)[1],
        ),
    }
    speed = {}
    for label, (single, other) in pairs.items():
        single_rates, other_rates = [], []
        for r in range(1 if args.quick else args.rounds):
            order = (single, other) if r % 2 == 0 else (other, single)
            for f in order:
                rate = len(lines) / f()
                (single_rates if f is single else other_rates).append(rate)
        speed[label] = paired_ratio_summary(other_rates, single_rates)
        log(f"{label}: {speed[label]['median']:.3f}x the single model's sentences/s")

    rows = [
        [name, f"{s['bleu']:.2f} ± {s['bleu_ci95']:.2f}", f"{s['chrf']:.2f}", f"{s['ter']:.2f}", f"{s['seconds']:.1f}"]
        for name, s in scores.items()
    ]
    print_table(
        f"Bible es→en test ({len(sources)} sentences), beam {args.num_beams}",
        ["model", "BLEU", "chrF", "TER", "seconds"],
        rows,
    )
    print_table(
        "terminology constraints from the references",
        [
            "model, beam",
            "BLEU with terms",
            "without, same beam",
            f"without, beam {args.num_beams}",
            "terms written",
            "lines without terms identical",
            "had every term unconstrained: changed, search errors",
        ],
        [
            [
                name,
                f"{w['bleu']:.2f}",
                f"{w['bleu_without_same_beam']:.2f}",
                f"{w['bleu_without']:.2f}",
                f"{w['terms_present']}/{w['terms']} (unconstrained: {w['terms_present_without']})",
                f"{w['lines_without_terms_identical']}/{w['lines_without_terms']}",
                f"{w['lines_with_all_terms_unconstrained']}: {w['of_them_changed']}, {w['of_them_search_errors']}",
            ]
            for name, w in with_terms.items()
        ],
    )
    print_table(
        f"speed, paired rounds on {len(lines)} sentences (ratio of sentences/s; < 1 is slower)",
        ["comparison", "median ratio", "IQR"],
        [[label, f"{s['median']:.3f}", f"{s['q1']:.3f}-{s['q3']:.3f}"] for label, s in speed.items()],
    )
    write_result(
        "ensembles_constraints",
        {"num_beams": args.num_beams, "scores": scores, "constraints": with_terms, "speed": speed},
        args.quick,
    )


if __name__ == "__main__":
    main()
