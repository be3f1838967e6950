"""translate for real work (translation/files.py, alignment.py): streaming chunks,
--resume, truncation, n-best lists with scores, word alignments and their AER, several ranks.

Models are the tiny trained runs of tests/helpers.py; the alignment task trains its own."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import FAMILIES, REPO_ROOT, build_tiny_run, read_pairs, run_process_tree

from attention_seq2seq.attention.alignment import (
    AERCounts,
    alignment_error_rate,
    attention_alignments,
    parse_pharaoh,
    piece_words,
    word_links,
)
from attention_seq2seq.cli import main
from attention_seq2seq.common.errors import UserError
from attention_seq2seq.translation.files import complete_records, token_budget_batches

GREEDY = ["--greedy", "--max-new-tokens", "12", "--no-progress"]


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("translate-files-runs")


@pytest.fixture(scope="module", params=FAMILIES)
def run(request, runs_root) -> Path:
    return build_tiny_run(request.param, runs_root)


def _sources(n: int, *, empty_every: int = 7) -> list[str]:
    """``n`` test sources with an empty line every ``empty_every`` lines."""
    pairs = read_pairs(n, split="test")
    return ["" if k % empty_every == 3 else s for k, (s, _) in enumerate(pairs)]


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------------
# Batching and resuming, by hand


def test_token_budget_batches_by_hand():
    lengths = [3, 0, 10, 4, 4, 9, 1]
    # Longest first; at most 2 sentences; at most 18 padded tokens (sentences x longest).
    # 10 alone (2 x 10 > 18); 9 and 4 (2 x 9 = 18); 4 and 3; 1.
    assert token_budget_batches(lengths, batch_size=2, batch_tokens=18) == [[2], [5, 3], [4, 0], [6]]
    assert token_budget_batches(lengths, batch_size=10, batch_tokens=None) == [[2, 5, 3, 4, 0, 6]]
    # A sentence longer than the budget goes alone; an empty one never goes.
    assert token_budget_batches([50, 2, 0], batch_size=8, batch_tokens=10) == [[0], [1]]


def test_complete_records_stops_before_a_partial_line_or_source(tmp_path):
    out = tmp_path / "out"
    out.write_bytes(b"a\nb\nc\nd\ne")  # 4 complete lines and a partial one
    assert complete_records(out, 1) == (4, 8)
    assert complete_records(out, 3) == (1, 6)  # 3 lines per source: the second source is incomplete
    assert complete_records(tmp_path / "missing", 1) == (0, 0)


# ------------------------------------------------------------------------------------------------
# Streaming files


def test_chunks_and_token_budget_do_not_change_greedy_output_and_empty_lines_stay(run, tmp_path):
    sources = _sources(23)
    source = _write(tmp_path / "in.txt", sources)
    outputs = []
    for options in (
        ["--chunk-lines", "1000"],
        ["--chunk-lines", "4", "--batch-tokens", "40"],
        ["--chunk-lines", "1", "--batch-size", "1"],
    ):
        target = tmp_path / f"out{len(outputs)}.txt"
        assert main(["translate", "-m", str(run), "-i", str(source), "-o", str(target), *GREEDY, *options]) == 0
        outputs.append(target.read_text(encoding="utf-8").split("\n"))
    lines = outputs[0]
    assert lines[-1] == "" and len(lines) - 1 == len(sources)  # one line per source, ending in \n
    assert all((line == "") == (src == "") for line, src in zip(lines, sources))
    assert outputs[1] == outputs[0] == outputs[2]


def test_resume_writes_only_what_is_missing_and_gives_the_same_bytes(runs_root, tmp_path, monkeypatch):
    from attention_seq2seq.translation import engine

    run = build_tiny_run("transformer_seq2seq", runs_root)
    sources = _sources(20)
    source = _write(tmp_path / "in.txt", sources)
    full = tmp_path / "full.txt"
    common = ["translate", "-m", str(run), "-i", str(source), *GREEDY, "--chunk-lines", "5"]
    assert main([*common, "-o", str(full)]) == 0
    expected = full.read_bytes()

    translated = []
    original = engine.Translator.translate

    def counting(self, sentences, first_line=1, stats=None, progress=None):
        translated.append(first_line)
        return original(self, sentences, first_line, stats, progress)

    monkeypatch.setattr(engine.Translator, "translate", counting)
    lines = expected.split(b"\n")
    partial = tmp_path / "partial.txt"
    # 12 complete lines (chunks 1-2 and 2 lines of chunk 3) and half of the 13th line.
    partial.write_bytes(b"\n".join(lines[:12]) + b"\n" + lines[12][: max(1, len(lines[12]) // 2)])
    assert main([*common, "-o", str(partial), "--resume"]) == 0
    assert partial.read_bytes() == expected
    assert translated == [11, 16]  # chunks 3 (lines 11-15, partly written) and 4; never 1 and 2

    translated.clear()
    assert main([*common, "-o", str(partial), "--resume"]) == 0  # a finished file: nothing to do
    assert partial.read_bytes() == expected and translated == []


@pytest.mark.slow
def test_resume_after_kill_9_gives_a_byte_identical_file(runs_root, tmp_path):
    run = build_tiny_run("rnn_seq2seq", runs_root)
    pairs = read_pairs(200, split="train")
    source = _write(tmp_path / "in.txt", [s for s, _ in pairs])
    command = [
        sys.executable,
        "-m",
        "attention_seq2seq.translate",
        "-m",
        str(run),
        "-i",
        str(source),
        *GREEDY,
        "--chunk-lines",
        "20",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    full, killed = tmp_path / "full.txt", tmp_path / "killed.txt"
    subprocess.run([*command, "-o", str(full)], check=True, env=env, capture_output=True, timeout=600)
    process = subprocess.Popen([*command, "-o", str(killed)], env=env, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline and (not killed.exists() or killed.read_bytes().count(b"\n") < 60):
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    written = killed.read_bytes().count(b"\n")
    assert 60 <= written < 200, written  # killed partway
    subprocess.run([*command, "-o", str(killed), "--resume"], check=True, env=env, capture_output=True, timeout=600)
    assert killed.read_bytes() == full.read_bytes()


def test_over_long_lines_are_truncated_with_one_warning_or_refused(runs_root, tmp_path, capsys):
    run = build_tiny_run("transformer_seq2seq", runs_root)
    short = "Ein Hund."
    long_line = " ".join(["Ein großer Hund läuft durch den Schnee."] * 4)
    source = _write(tmp_path / "in.txt", [short, long_line, short, long_line])
    target = tmp_path / "out.txt"
    argv = ["translate", "-m", str(run), "-i", str(source), "-o", str(target), *GREEDY, "--max-source-length", "8"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert err.count("warning") == 1 and "2 line(s) longer than 8 tokens were truncated (first: line 2)" in err
    assert len(target.read_text(encoding="utf-8").splitlines()) == 4

    assert main([*argv, "--no-truncate"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "line 2:" in err[0] and "--no-truncate" in err[0]


# ------------------------------------------------------------------------------------------------
# n-best lists with scores


def _teacher_forced_logprob(model, input_ids, generated, with_length: bool = False):
    """Σ log p(y_t | y_<t, x) of the generated tokens (after the decoder start) up to </s>
    (and their number, with ``with_length``)."""
    tokens = generated[1:].tolist()
    eos = model.generation_config.eos_token_id
    if eos in tokens:
        tokens = tokens[: tokens.index(eos) + 1]
    labels = torch.tensor([tokens])
    logits = model(input_ids=input_ids, labels=labels).logits  # (1, tgt_len, vocab_size)
    total = logits.log_softmax(-1)[0].gather(1, labels[0].unsqueeze(1)).sum().item()
    return (total, len(tokens)) if with_length else total


def test_n_best_scores_equal_transition_scores_beam_scores_and_a_teacher_forced_sum(run, tmp_path):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    sentences = [s for s, _ in read_pairs(4, split="test")]
    source = _write(tmp_path / "in.txt", sentences)
    target = tmp_path / "nbest.tsv"
    argv = [
        "translate",
        "-m",
        str(run),
        "-i",
        str(source),
        "-o",
        str(target),
        "--n-best",
        "3",
        "--scores",
        "--num-beams",
        "4",
        "--max-new-tokens",
        "10",
        "--batch-size",
        "1",
        "--no-progress",
    ]
    assert main(argv) == 0
    rows = [line.split("\t") for line in target.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 3 * len(sentences)

    tokenizer = AutoTokenizer.from_pretrained(run / "model")
    model = AutoModelForSeq2SeqLM.from_pretrained(run / "model").eval()
    with torch.inference_mode():
        for k, sentence in enumerate(sentences):
            encoded = tokenizer([sentence], return_tensors="pt")
            out = model.generate(
                **encoded,
                num_beams=4,
                num_return_sequences=3,
                max_new_tokens=10,
                output_scores=True,
                return_dict_in_generate=True,
            )
            transition = model.compute_transition_scores(
                out.sequences, out.scores, out.beam_indices, normalize_logits=False
            )
            mine = rows[3 * k : 3 * k + 3]
            assert [r[:2] for r in mine] == [[str(k), str(rank)] for rank in range(3)]
            assert len({r[2] for r in mine}) == 3  # K distinct hypotheses
            for rank, row in enumerate(mine):
                assert row[2] == tokenizer.decode(out.sequences[rank], skip_special_tokens=True).strip()
                logprob, score = float(row[3]), float(row[4])
                assert logprob == pytest.approx(transition[rank].sum().item(), abs=1e-4)
                assert score == pytest.approx(out.sequences_scores[rank].item(), abs=1e-4)
                forced = _teacher_forced_logprob(model, encoded["input_ids"], out.sequences[rank])
                assert logprob == pytest.approx(forced, abs=1e-4)


def test_greedy_scores_and_jsonl_format(runs_root, tmp_path):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    run = build_tiny_run("rnn_seq2seq", runs_root)
    sentences = [s for s, _ in read_pairs(3, split="test")]
    source = _write(tmp_path / "in.txt", [sentences[0], "", *sentences[1:]])
    target = tmp_path / "out.jsonl"
    argv = [
        "translate",
        "-m",
        str(run),
        "-i",
        str(source),
        "-o",
        str(target),
        "--scores",
        "--format",
        "jsonl",
        "--batch-size",
        "1",
        *GREEDY,
    ]
    assert main(argv) == 0
    records = [json.loads(line) for line in target.read_text(encoding="utf-8").splitlines()]
    assert [r["index"] for r in records] == [0, 1, 2, 3]
    assert records[1]["hypotheses"] == [{"text": "", "logprob": 0.0, "score": 0.0}]
    tokenizer = AutoTokenizer.from_pretrained(run / "model")
    model = AutoModelForSeq2SeqLM.from_pretrained(run / "model").eval()
    with torch.inference_mode():
        for record, sentence in zip([records[0], *records[2:]], sentences):
            encoded = tokenizer([sentence], return_tensors="pt")
            generated = model.generate(**encoded, num_beams=1, do_sample=False, max_new_tokens=12)[0]
            (hyp,) = record["hypotheses"]
            assert hyp["text"] == tokenizer.decode(generated, skip_special_tokens=True).strip()
            forced, length = _teacher_forced_logprob(model, encoded["input_ids"], generated, with_length=True)
            assert hyp["logprob"] == pytest.approx(forced, abs=1e-4)
            assert hyp["score"] == pytest.approx(forced / length, abs=1e-4)  # length_penalty 1.0


def test_text_format_refuses_n_best(runs_root, tmp_path, capsys):
    run = build_tiny_run("rnn_seq2seq", runs_root)
    assert main(["translate", "-m", str(run), "Hallo", "--n-best", "2", "--format", "text"]) == 2
    assert "--format tsv or jsonl" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# Alignments and AER


def test_aer_by_hand():
    # Och & Ney (2003): AER = 1 - (|A∩S| + |A∩P|) / (|A| + |S|).
    # S = {0-0, 1-2}; P = S ∪ {2-1}; A = {0-0, 2-1, 2-2}:
    # |A∩S| = 1, |A∩P| = 2, |A| = 3, |S| = 2 → AER = 1 - 3/5 = 0.4.
    counts = alignment_error_rate(["0-0 2-1 2-2"], ["0-0 1-2 2?1"])
    assert counts.aer == pytest.approx(0.4)
    assert counts.precision == pytest.approx(2 / 3) and counts.recall == pytest.approx(1 / 2)
    # Corpus level: counts add up over sentences (a perfect second pair: 1 - (3+3+2)/(3+2+... )).
    counts = alignment_error_rate(["0-0 2-1 2-2", "0-1 1-0"], ["0-0 1-2 2?1", "0-1 1-0"])
    assert counts.aer == pytest.approx(1 - (1 + 2 + 2 + 2) / (3 + 2 + 2 + 2))
    assert parse_pharaoh("0-1 2?3") == ({(0, 1)}, {(0, 1), (2, 3)})
    with pytest.raises(UserError, match=r"gold line 1: '0:1' is not a link"):
        alignment_error_rate(["0-1"], ["0:1"])
    with pytest.raises(UserError, match="line-aligned"):
        alignment_error_rate(["0-1"], [])


def test_alignment_error_rate_command(tmp_path, capsys):
    hyp, gold = _write(tmp_path / "hyp", ["0-0 2-1 2-2"]), _write(tmp_path / "gold", ["0-0 1-2 2?1"])
    assert main(["alignment-error-rate", str(hyp), "--gold", str(gold), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["aer"] == pytest.approx(0.4)
    assert main(["alignment-error-rate", str(hyp), "--gold", str(tmp_path / "nope")]) == 2
    assert "--gold: file not found" in capsys.readouterr().err


def test_pieces_merge_to_words_and_argmax_skips_special_tokens():
    text = "Ein Hund läuft."
    # Offsets as the unigram tokenizer gives them: "▁Hund" holds its space; a bare "▁" piece; "</s>".
    offsets = [(0, 3), (3, 8), (8, 9), (9, 12), (12, 14), (14, 15), (0, 0)]
    words = piece_words(text, offsets)
    assert words == [0, 1, 2, 2, 2, 2, None]
    weights = torch.tensor(
        [
            [0.1, 0.1, 0.0, 0.0, 0.0, 0.0, 0.8],  # the largest weight on </s>: skipped, word 0 wins
            [0.0, 0.0, 0.0, 0.9, 0.1, 0.0, 0.0],
        ]
    )
    assert word_links(weights, words, [0, 0]) == {(0, 0), (2, 0)}


def _word_tokenizer(words: list[str]):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<pad>", "<s>", "</s>", "<unk>", *words])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_attention_aligns_a_reversal_task(family, tmp_path, capsys):
    """Trained to reverse word sequences, the attention (the RNN's; the Transformer's last layer,
    heads averaged) aligns source word i with target word n-1-i: AER <= 0.05."""
    from transformers import AutoModelForSeq2SeqLM

    from attention_seq2seq import RNNSeq2SeqConfig, TransformerSeq2SeqConfig

    words = [f"w{i}" for i in range(20)]
    tokenizer = _word_tokenizer(words)
    rng = random.Random(0)

    def pair():
        seq = [rng.choice(words) for _ in range(rng.randint(3, 8))]
        return " ".join(seq), " ".join(reversed(seq))

    torch.manual_seed(0)
    if family == "rnn_seq2seq":
        config = RNNSeq2SeqConfig(
            vocab_size=len(tokenizer),
            embedding_size=32,
            hidden_size=64,
            cell_type="gru",
            attention="bahdanau",
            dropout=0.0,
        )
    else:
        config = TransformerSeq2SeqConfig(
            vocab_size=len(tokenizer),
            d_model=64,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=128,
            decoder_ffn_dim=128,
            dropout=0.0,
            max_position_embeddings=32,
        )
    model = AutoModelForSeq2SeqLM.from_config(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    # 600 updates: at 300 the Transformer's AER depended on the host's float rounding (0.16 on an AMD
    # EPYC, <= 0.05 on an Intel Xeon); at 600 it is 0.018 on the EPYC, the RNN's 0.0 on both.
    for _ in range(600):
        batch_pairs = [pair() for _ in range(32)]
        batch = tokenizer(
            [s for s, _ in batch_pairs], text_target=[t for _, t in batch_pairs], padding=True, return_tensors="pt"
        )
        batch["labels"] = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    test = [pair() for _ in range(50)]
    links = attention_alignments(model, tokenizer, [s for s, _ in test], [t for _, t in test], layer=-1)
    counts = AERCounts()
    for (source, _), found in zip(test, links):
        n = len(source.split())
        gold = {(i, n - 1 - i) for i in range(n)}
        counts.add(found, gold, gold)
    assert counts.aer <= 0.05, counts.aer

    # The same through the command line: --alignments of a saved model's own translations.
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    source = _write(tmp_path / "in.txt", [s for s, _ in test])
    out, align = tmp_path / "out.txt", tmp_path / "out.align"
    assert (
        main(
            [
                "translate",
                "-m",
                str(tmp_path / "model"),
                "-i",
                str(source),
                "-o",
                str(out),
                "--alignments",
                str(align),
                "--greedy",
                "--max-new-tokens",
                "12",
                "--no-progress",
            ]
        )
        == 0
    )
    reversal = [" ".join(f"{i}-{len(s.split()) - 1 - i}" for i in range(len(s.split()))) for s, _ in test]
    gold_file = _write(tmp_path / "gold.align", reversal)
    assert main(["alignment-error-rate", str(align), "--gold", str(gold_file), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    correct = sum(o == t for o, (_, t) in zip(out.read_text().splitlines(), test))
    # It did learn to reverse: 44 of 50 greedy outputs exact on an AVX2-only AMD EPYC, 46+ on an Intel
    # Xeon; a model that had not learned the task gets almost none right.
    assert correct >= 40, correct
    assert result["aer"] <= 0.05


def test_alignments_file_is_line_aligned_with_the_n_best_output(runs_root, tmp_path, capsys):
    run = build_tiny_run("transformer_seq2seq", runs_root)
    source = _write(tmp_path / "in.txt", ["Ein Hund läuft.", "", "Zwei Männer."])
    out, align = tmp_path / "out.tsv", tmp_path / "out.align"
    argv = [
        "translate",
        "-m",
        str(run),
        "-i",
        str(source),
        "-o",
        str(out),
        "--n-best",
        "2",
        "--alignments",
        str(align),
        "--align-layer",
        "0",
        "--align-heads",
        "1",
        "--max-new-tokens",
        "8",
        "--no-progress",
    ]
    assert main(argv) == 0
    rows = [line.split("\t") for line in out.read_text(encoding="utf-8").splitlines()]
    links = align.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(rows) == len(links) == 6
    for row, line in zip(rows, links):
        _, found = parse_pharaoh(line)
        n_src = len(["Ein Hund läuft.", "", "Zwei Männer."][int(row[0])].split())
        assert all(i < n_src and j < len(row[2].split()) for i, j in found)
    assert links[2] == links[3] == ""  # the empty source
    assert main([*argv[:-1], "--align-heads", "5"]) == 2
    assert "--align-heads 5: layer 0 has 2 head(s)" in capsys.readouterr().err
    assert main([*argv, "--align-layer", "3"]) == 2
    assert "--align-layer 3" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# Several processes


@pytest.mark.slow
def test_two_cpu_ranks_write_the_file_one_process_writes(runs_root, tmp_path):
    run = build_tiny_run("transformer_seq2seq", runs_root)
    source = _write(tmp_path / "in.txt", _sources(45))
    options = [
        "-m",
        str(run),
        "-i",
        str(source),
        "--n-best",
        "2",
        "--scores",
        "--max-new-tokens",
        "8",
        "--chunk-lines",
        "4",
        "--no-progress",
    ]
    one, two = tmp_path / "one.tsv", tmp_path / "two.tsv"
    assert main(["translate", *options, "-o", str(one)]) == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # On a CPU host `--multi_gpu` is what makes accelerate start N ranks (gloo; `--cpu` starts one).
    accelerate = Path(sys.executable).with_name("accelerate")
    command = [
        str(accelerate),
        "launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--main_process_port",
        str(port),
        "-m",
        "attention_seq2seq.translate",
        *options,
        "-o",
        str(two),
    ]
    completed = run_process_tree(command, timeout=600, cwd=REPO_ROOT, env=env)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "translating with 2 processes" in completed.stderr
    assert two.read_bytes() == one.read_bytes()


GOLD_SAMPLE = REPO_ROOT / "data" / "alignments" / "multi30k-test2016-de-en"


def test_the_hand_aligned_sample_is_well_formed():
    de = (GOLD_SAMPLE / "test2016.first30.de").read_text(encoding="utf-8").splitlines()
    en = (GOLD_SAMPLE / "test2016.first30.en").read_text(encoding="utf-8").splitlines()
    gold = (GOLD_SAMPLE / "gold.align").read_text(encoding="utf-8").splitlines()
    assert len(de) == len(en) == len(gold) == 30
    for number, (source, target, line) in enumerate(zip(de, en, gold), start=1):
        sure, possible = parse_pharaoh(line, where=f"gold.align line {number}")
        assert sure and sure <= possible
        assert all(i < len(source.split()) and j < len(target.split()) for i, j in possible), number


def test_alignment_error_rate_of_a_model_scores_each_layer_by_teacher_forcing(runs_root, capsys):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from attention_seq2seq.attention.alignment import format_pharaoh

    run = build_tiny_run("transformer_seq2seq", runs_root)
    src, ref = GOLD_SAMPLE / "test2016.first30.de", GOLD_SAMPLE / "test2016.first30.en"
    gold = GOLD_SAMPLE / "gold.align"
    assert (
        main(
            [
                "alignment-error-rate",
                "-m",
                str(run),
                "--src",
                str(src),
                "--ref",
                str(ref),
                "--gold",
                str(gold),
                "--json",
            ]
        )
        == 0
    )
    result = json.loads(capsys.readouterr().out)
    assert list(result) == ["layer 0"]  # the tiny Transformer has one decoder layer
    # The same number from the library calls, one sentence at a time.
    tokenizer = AutoTokenizer.from_pretrained(run / "model")
    model = AutoModelForSeq2SeqLM.from_pretrained(run / "model").eval()
    sources, targets = src.read_text().splitlines(), ref.read_text().splitlines()
    lines = [
        format_pharaoh(attention_alignments(model, tokenizer, [s], [t], layer=0)[0]) for s, t in zip(sources, targets)
    ]
    expected = alignment_error_rate(lines, gold.read_text().splitlines())
    assert result["layer 0"]["aer"] == pytest.approx(expected.aer, abs=1e-9)
    with pytest.raises(SystemExit) as exit_info:
        main(["alignment-error-rate", "--gold", str(gold)])
    assert exit_info.value.code == 2 and "HYPOTHESIS" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# One engine: evaluate, translate and the library calls decode the same way


@pytest.mark.parametrize("decoding", [["--greedy"], ["--num-beams", "3"]], ids=["greedy", "beam3"])
def test_evaluate_and_translate_write_the_same_lines(run, tmp_path, decoding):
    """The same options give the same bytes through ``evaluate --hypotheses`` and ``translate``:
    one engine encodes, truncates (here 6 tokens, so most lines are cut), batches by tokens and
    decodes for both; empty lines stay empty."""
    pairs = read_pairs(23, split="test")
    sources = ["" if k % 7 == 3 else s for k, (s, _) in enumerate(pairs)]
    src = _write(tmp_path / "src.txt", sources)
    ref = _write(tmp_path / "ref.txt", [t for _, t in pairs])
    options = [*decoding, "--max-new-tokens", "12", "--no-progress", "--batch-size", "4", "--batch-tokens", "30"]
    options += ["--max-source-length", "6"]
    hypotheses, translated = tmp_path / "evaluate.txt", tmp_path / "translate.txt"
    evaluate = ["evaluate", "-m", str(run), "--src", str(src), "--ref", str(ref), "--hypotheses", str(hypotheses)]
    assert main([*evaluate, "--output", str(tmp_path / "scores.json"), *options]) == 0
    assert main(["translate", "-m", str(run), "-i", str(src), "-o", str(translated), *options]) == 0
    assert hypotheses.read_bytes() == translated.read_bytes()
    lines = translated.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(lines) == len(sources) and all(line == "" for s, line in zip(sources, lines) if not s)


def test_library_n_best_scores_are_the_translate_commands(run, tmp_path, caplog):
    """``translate_n_best`` (what evaluate and the benchmarks call) returns the hypotheses and
    length-normalised scores the translate command writes with ``--n-best 3 --scores``, best first,
    and warns once about the sentences it truncated."""
    from attention_seq2seq.translation.loading import load_for_inference, translate_n_best

    sources = _sources(11)
    loaded = load_for_inference(run, device="cpu")
    with caplog.at_level("WARNING", logger="attention_seq2seq.translation.loading"):
        found = translate_n_best(
            loaded, sources, num_beams=4, num_return_sequences=3, max_new_tokens=12, max_source_length=6
        )
    non_empty = [s for s in sources if s]
    long_ones = [s for s in non_empty if len(loaded.tokenizer(s)["input_ids"]) > 6]
    assert long_ones and f"{len(long_ones)} sentence(s) longer than 6 tokens were truncated" in caplog.text
    src = _write(tmp_path / "src.txt", sources)
    out = tmp_path / "nbest.tsv"
    common = ["translate", "-m", str(run), "-i", str(src), "-o", str(out), "--no-progress"]
    flags = ["--num-beams", "4", "--n-best", "3", "--scores", "--max-new-tokens", "12", "--max-source-length", "6"]
    assert main([*common, *flags]) == 0
    rows = [line.split("\t") for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 3 * len(sources)
    for index, hypotheses in enumerate(found):
        mine = rows[3 * index : 3 * index + 3]
        assert [h for h, _ in hypotheses] == [r[2] for r in mine]
        if sources[index]:
            scores = [score for _, score in hypotheses]
            assert scores == sorted(scores, reverse=True)
            assert scores == pytest.approx([float(r[4]) for r in mine], abs=2e-6)
        else:
            assert hypotheses == [("", None)] * 3
