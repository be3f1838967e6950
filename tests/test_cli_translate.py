"""``translate`` and ``evaluate`` past one model (attention_seq2seq/cli/translate.py): ensembles
(-m given several times, --ensemble-weights), terminology constraints (--constraints) and scores
per sentence (--per-sentence, TER), run in-process through ``main([...])`` on the tiny runs of
tests/helpers.py, whose two families share one tokenizer."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import FAMILIES, build_tiny_run, build_tokenizer, one_line_error, read_pairs

from attention_seq2seq.cli import main

BIBLE_CONSTRAINTS = Path(__file__).resolve().parent / "fixtures" / "bible-constraints"


@pytest.fixture(scope="session")
def runs_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.getbasetemp() / "cli-translate-tiny-runs"
    root.mkdir(exist_ok=True)
    return root


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Path:
    """Twelve validation sources, one of them empty (it must stay an empty line)."""
    lines = [s for s, _ in read_pairs(12, split="val")]
    lines[5] = ""
    path = tmp_path_factory.mktemp("sources") / "val.src"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _translate(tmp_path: Path, name: str, models: list[Path], source: Path, *options: str) -> str:
    output = tmp_path / name
    argv = ["translate", *(x for m in models for x in ("-m", str(m))), "--input", str(source)]
    assert main([*argv, "--output", str(output), "--no-progress", *options]) == 0
    return output.read_text(encoding="utf-8")


def _one_line_error(capsys, argv: list[str]) -> str:
    return one_line_error(capsys, main, argv)


# ---------------------------------------------------------------------------------------------
# Ensembles


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("decoding", [["--greedy"], ["--num-beams", "5"], ["--num-beams", "3", "--n-best", "3"]])
def test_an_ensemble_of_a_model_with_itself_writes_the_model_s_own_output(
    family, decoding, runs_root, sources, tmp_path
):
    run = build_tiny_run(family, runs_root)
    alone = _translate(tmp_path, "alone.txt", [run], sources, *decoding)
    twice = _translate(tmp_path, "twice.txt", [run, run], sources, *decoding)
    assert twice == alone
    assert len(alone.splitlines()) == 12 * (3 if "--n-best" in decoding else 1)


def test_a_mixed_ensemble_weighs_its_members(runs_root, sources, tmp_path):
    rnn, transformer = (build_tiny_run(family, runs_root) for family in ("rnn_seq2seq", "transformer_seq2seq"))
    options = ("--num-beams", "4")
    rnn_alone = _translate(tmp_path, "rnn.txt", [rnn], sources, *options)
    transformer_alone = _translate(tmp_path, "transformer.txt", [transformer], sources, *options)
    assert rnn_alone != transformer_alone  # else the checks below could not tell the members apart
    # A member of weight 0 adds nothing to the step scores: the other member decodes alone.
    only_rnn = _translate(tmp_path, "w10.txt", [rnn, transformer], sources, *options, "--ensemble-weights", "1,0")
    only_transformer = _translate(
        tmp_path, "w01.txt", [rnn, transformer], sources, *options, "--ensemble-weights", "0,2"
    )
    assert (only_rnn, only_transformer) == (rnn_alone, transformer_alone)
    both = _translate(tmp_path, "both.txt", [rnn, transformer], sources, *options)
    assert len(both.splitlines()) == 12 and both.splitlines()[5] == ""
    assert both != rnn_alone or both != transformer_alone


def test_evaluate_an_ensemble_names_its_members_and_writes_into_no_member_s_folder(runs_root, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(build_tiny_run("transformer_seq2seq", runs_root), run)
    before = sorted(p.name for p in run.iterdir())
    pairs = read_pairs(8, split="val")
    src, ref = tmp_path / "val.src", tmp_path / "val.ref"
    src.write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    ref.write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    argv = ["evaluate", "-m", str(run), "-m", str(run), "--src", str(src), "--ref", str(ref), "--no-progress"]
    assert main([*argv, "--ensemble-weights", "3,1"]) == 0
    assert "no JSON written" in capsys.readouterr().err
    assert sorted(p.name for p in run.iterdir()) == before
    output = tmp_path / "ensemble.json"
    assert main([*argv, "--output", str(output)]) == 0
    (result,) = json.loads(output.read_text(encoding="utf-8")).values()
    assert result["model"] == f"{run} + {run}" and result["ensemble_weights"] == [0.5, 0.5]
    single = tmp_path / "single.json"
    assert (
        main(["evaluate", "-m", str(run), "--src", str(src), "--ref", str(ref), "--no-progress", "-o", str(single)])
        == 0
    )
    (alone,) = json.loads(single.read_text(encoding="utf-8")).values()
    assert (result["bleu"], result["chrf"], result["ter"]) == (alone["bleu"], alone["chrf"], alone["ter"])


def test_ensemble_mistakes_get_one_line(runs_root, sources, tmp_path, capsys):
    run = build_tiny_run("transformer_seq2seq", runs_root)
    capsys.readouterr()  # building the run may print save_pretrained's progress
    base = ["translate", "--input", str(sources), "--no-progress"]
    line = _one_line_error(capsys, [*base, "-m", str(run), "-m", str(tmp_path / "nope")])
    assert "ensemble member 2" in line and "nope" in line and "not found" in line
    line = _one_line_error(capsys, [*base, "-m", str(run), "-m", str(run), "--ensemble-weights", "1,2,3"])
    assert "3 weight(s) for 2 models" in line
    line = _one_line_error(capsys, [*base, "-m", str(run), "--ensemble-weights", "1"])
    assert "two or more models" in line
    line = _one_line_error(capsys, [*base, "-m", str(run), "-m", str(run), "--ensemble-weights", "1,x"])
    assert "--ensemble-weights" in line and "comma-separated numbers" in line
    line = _one_line_error(capsys, [*base, "-m", str(run), "-m", str(run), "--alignments", str(tmp_path / "a")])
    assert "--alignments" in line and "ensemble" in line
    line = _one_line_error(
        capsys, ["evaluate", "-m", str(run), "-m", str(run), "--src", "a", "--ref", "b", "--update-metrics"]
    )
    assert "--update-metrics" in line and "ensemble" in line
    # A member with another tokenizer: its token ids mean other words.
    other = tmp_path / "other"
    shutil.copytree(run, other)
    build_tokenizer(read_pairs(60, split="train", offset=200)).save_pretrained(other / "model")
    line = _one_line_error(capsys, [*base, "-m", str(run), "-m", str(other)])
    assert "share one tokenizer" in line and str(run) in line and str(other) in line


# ---------------------------------------------------------------------------------------------
# Terminology constraints


def _phrases(tokenizer, reference: str) -> list[str]:
    """Up to two words of ``reference`` (its longest, then its last of 4+ letters) that the
    tokenizer writes back unchanged, so that the output text can be searched for them."""
    words = [w.strip(".,;:!?\"'()") for w in reference.split()]
    words = [w for w in words if len(w) >= 4 and w.isalpha()]
    picked = []
    for word in sorted(words, key=len, reverse=True)[:1] + words[-1:]:
        ids = tokenizer(text_target=word, add_special_tokens=False)["input_ids"]
        if word not in picked and ids and tokenizer.decode(ids, skip_special_tokens=True).strip() == word:
            picked.append(word)
    return picked


@pytest.mark.parametrize("family", FAMILIES)
def test_every_constraint_is_written_and_lines_without_any_are_untouched(family, runs_root, tmp_path):
    from transformers import AutoTokenizer

    run = build_tiny_run(family, runs_root)
    tokenizer = AutoTokenizer.from_pretrained(run / "model")
    pairs = read_pairs(10, split="val", offset=12)
    source = tmp_path / "src.txt"
    source.write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    terms = [_phrases(tokenizer, t) if i % 3 else [] for i, (_, t) in enumerate(pairs)]  # lines 0, 3, 6, 9: none
    assert sum(map(bool, terms)) >= 4
    constraints = tmp_path / "terms.tsv"
    constraints.write_text("".join("\t".join(t) + "\n" for t in terms), encoding="utf-8")
    options = ("--num-beams", "4", "--max-new-tokens", "40")
    plain = _translate(tmp_path, "plain.txt", [run], source, *options).splitlines()
    constrained = _translate(
        tmp_path, "constrained.txt", [run], source, *options, "--constraints", str(constraints)
    ).splitlines()
    for line, phrases, before, after in zip(range(10), terms, plain, constrained):
        assert all(p in after for p in phrases), (line, phrases, after)
        if not phrases:
            assert after == before, line
    assert any(not all(p in b for p in t) for t, b in zip(terms, plain))  # the constraints changed something
    # With scores: a line without constraints scores as in plain beam search (whose total comes
    # from compute_transition_scores; the constrained search's from score × length^alpha).
    scored = _translate(
        tmp_path, "scored.tsv", [run], source, *options, "--constraints", str(constraints), "--scores"
    ).splitlines()
    plain_scored = _translate(tmp_path, "plain.tsv", [run], source, *options, "--scores").splitlines()
    rows, plain_rows = [r.split("\t") for r in scored], [r.split("\t") for r in plain_scored]
    assert [row[2] for row in rows] == constrained
    for phrases, row, plain_row in zip(terms, rows, plain_rows):
        assert float(row[3]) < 0 and float(row[4]) < 0
        if not phrases:
            assert float(row[4]) == pytest.approx(float(plain_row[4]), rel=1e-5)
            assert float(row[3]) == pytest.approx(float(plain_row[3]), rel=1e-4)


def test_an_ensemble_takes_constraints_too(runs_root, tmp_path):
    from transformers import AutoTokenizer

    rnn, transformer = (build_tiny_run(family, runs_root) for family in ("rnn_seq2seq", "transformer_seq2seq"))
    tokenizer = AutoTokenizer.from_pretrained(rnn / "model")
    pairs = read_pairs(4, split="val", offset=30)
    source = tmp_path / "src.txt"
    source.write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    terms = [_phrases(tokenizer, t) for _, t in pairs]
    constraints = tmp_path / "terms.tsv"
    constraints.write_text("".join("\t".join(t) + "\n" for t in terms), encoding="utf-8")
    out = _translate(
        tmp_path, "out.txt", [rnn, transformer], source, "--num-beams", "3", "--constraints", str(constraints)
    )
    for phrases, line in zip(terms, out.splitlines()):
        assert all(p in line for p in phrases), (phrases, line)


def test_constraint_mistakes_get_one_line_naming_the_file(runs_root, sources, tmp_path, capsys):
    run = build_tiny_run("transformer_seq2seq", runs_root)
    capsys.readouterr()
    base = ["translate", "-m", str(run), "--input", str(sources), "--no-progress"]
    short = tmp_path / "short.tsv"
    short.write_text("Hund\n\n", encoding="utf-8")
    line = _one_line_error(capsys, [*base, "--constraints", str(short)])
    assert str(short) in line and "2 line(s)" in line and "12" in line
    empty = tmp_path / "empty.tsv"
    empty.write_text("a\t\tb\n" + "\n" * 11, encoding="utf-8")
    line = _one_line_error(capsys, [*base, "--constraints", str(empty)])
    assert f"{empty}:1:" in line and "empty constraint" in line
    line = _one_line_error(capsys, [*base, "--constraints", str(tmp_path / "missing.tsv")])
    assert "missing.tsv" in line
    line = _one_line_error(capsys, ["translate", "-m", str(run), "--constraints", str(short)])
    assert "--constraints" in line and "--input" in line
    line = _one_line_error(capsys, [*base, "--constraints", str(short).replace("short", "x"), "--do-sample"])
    assert "missing" not in line  # checked before reading: sampling and constraints exclude each other
    assert "--do-sample" in line


@pytest.mark.slow
def test_the_bible_fixture_s_terms_all_appear(runs_root, tmp_path):
    """tests/fixtures/bible-constraints: 50 Bible test sources (es) and terms from their references
    (en), as docs/ensembles-and-constraints.md measures them on the main-job models; here with the
    tiny Transformer, whose vocabulary writes every one of them (checked first)."""
    from transformers import AutoTokenizer

    run = build_tiny_run("transformer_seq2seq", runs_root)
    tokenizer = AutoTokenizer.from_pretrained(run / "model")
    terms = [line.split("\t") if line else [] for line in _lines(BIBLE_CONSTRAINTS / "terms.tsv")]
    assert len(terms) == 50 and len(_lines(BIBLE_CONSTRAINTS / "test.es")) == 50
    writable = [
        [p for p in t if tokenizer.decode(tokenizer(text_target=p, add_special_tokens=False)["input_ids"]) == p]
        for t in terms
    ]
    constraints = tmp_path / "terms.tsv"
    constraints.write_text("".join("\t".join(t) + "\n" for t in writable), encoding="utf-8")
    out = _translate(
        tmp_path, "out.txt", [run], BIBLE_CONSTRAINTS / "test.es", "--num-beams", "4", "--constraints", str(constraints)
    ).splitlines()
    assert sum(map(len, writable)) >= 40
    for phrases, line in zip(writable, out):
        assert all(p in line for p in phrases), (phrases, line)


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]


# ---------------------------------------------------------------------------------------------
# Scores per sentence


def test_per_sentence_scores_are_sacrebleu_s_and_ter_joins_the_table(runs_root, tmp_path, capsys):
    run = build_tiny_run("rnn_seq2seq", runs_root)
    pairs = read_pairs(15, split="val")
    src, ref = tmp_path / "val.src", tmp_path / "val.ref"
    src.write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    ref.write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    hyp, rows_file, output = tmp_path / "val.hyp", tmp_path / "rows.tsv", tmp_path / "eval.json"
    argv = ["evaluate", "-m", str(run), "--src", str(src), "--ref", str(ref), "--no-progress"]
    argv += ["--hypotheses", str(hyp), "--per-sentence", str(rows_file), "-o", str(output)]
    assert main(argv) == 0
    table = capsys.readouterr().out.splitlines()
    header, *rows = [line.split("\t") for line in _lines(rows_file)]
    assert header == ["line", "bleu", "chrf", "ter", "hypothesis", "reference"]
    assert [r[0] for r in rows] == [str(i) for i in range(1, 16)]
    assert [r[4] for r in rows] == _lines(hyp) and [r[5] for r in rows] == [t for _, t in pairs]
    sacrebleu_cli = Path(sys.executable).with_name("sacrebleu")
    for column, metric in ((1, "bleu"), (2, "chrf"), (3, "ter")):
        printed = subprocess.run(
            [str(sacrebleu_cli), str(ref), "-i", str(hyp), "-sl", "-m", metric, "-w", "4", "-f", "text"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
        assert [r[column] for r in rows] == [line.split(" = ")[1].split()[0] for line in printed], metric
    (result,) = json.loads(output.read_text(encoding="utf-8")).values()
    assert table[0].split() == ["test", "set", "sentences", "beams", "BLEU", "chrF", "TER"]
    assert table[2].split()[-1] == f"{result['ter']:.2f}"
    assert f"TER signature: {result['ter_signature']} (lower is better)" in table
