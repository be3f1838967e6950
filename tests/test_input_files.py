"""Fault injection (issue 43, item 8): hostile and broken files.

Every corpus reader (line-aligned ``text``, ``tsv``, ``jsonl``, and ``hf`` folders of JSON Lines
or CSV data files) is given the clean file with one fault at a time. A benign fault (CRLF line
ends, a UTF-8 BOM, a 10 MB line) gives exactly the pairs of the clean file; a fatal one (invalid
UTF-8, a NUL byte, a UTF-16 file, an empty file, source and target that do not pair up) is one
:class:`CorpusError` line naming the file, the line (or row) and what would be valid. A 10 MB line
is read, in linear time, and the length filter drops it.

A model folder with a cut ``model.safetensors``, a ``config.json`` of another model (BERT; a
Marian config over this package's weights), a cut ``tokenizer.json`` or a tokenizer larger than
the embeddings is one ``error:`` line of the command line naming the folder, the file and what is
wrong; the intact folder and a genuine Marian folder still load.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest

from helpers import build_tokenizer, one_line_error, read_pairs, tiny_model

from attention_seq2seq.data.corpora import load_corpus
from attention_seq2seq.data.spec import CorpusError

# The clean corpus: line 3 holds non-ASCII letters before "Zug", so a character column (what an
# editor shows) differs from a byte column.
TRAIN = [
    ("Ein Hund läuft.", "A dog runs."),
    ("Eine Katze schläft.", "A cat sleeps."),
    ("Über die Brücke fährt ein Zug.", "A train crosses the bridge."),
    ("Das Haus ist groß.", "The house is big."),
    ("Wir essen Äpfel.", "We eat apples."),
]
DEV = [("Guten Morgen.", "Good morning.")]
TEST = [("Gute Nacht.", "Good night.")]
FAULTY_ROW = 2  # TRAIN[2], the source of which each fault touches
LONG = "Wort " * 2_000_000  # a 10 MB line

# ---------------------------------------------------------------------------------- the readers
# Each writes the corpus in its format into a folder and returns (spec, train file(s)): the file
# a fault goes into (for "text", the source file first) and the file line of TRAIN[0].


def _jsonl(rows, keys) -> bytes:
    return "".join(json.dumps(dict(zip(keys, row)), ensure_ascii=False) + "\n" for row in rows).encode()


def _write_text(folder: Path, train) -> tuple[str, list[Path], int]:
    for split, rows in (("train", train), ("dev", DEV), ("test", TEST)):
        for side, lang in enumerate(("de", "en")):
            (folder / f"{split}.{lang}").write_bytes("".join(row[side] + "\n" for row in rows).encode())
    return f"text:{folder}:de-en", [folder / "train.de", folder / "train.en"], 1


def _write_tsv(folder: Path, train) -> tuple[str, list[Path], int]:
    for split, rows in (("train", train), ("dev", DEV), ("test", TEST)):
        (folder / f"{split}.tsv").write_bytes("".join(f"{s}\t{t}\n" for s, t in rows).encode())
    return f"tsv:{folder}:de-en", [folder / "train.tsv"], 1


def _write_jsonl(folder: Path, train) -> tuple[str, list[Path], int]:
    for split, rows in (("train", train), ("dev", DEV), ("test", TEST)):
        (folder / f"{split}.jsonl").write_bytes(_jsonl(rows, ("de", "en")))
    return f"jsonl:{folder}:de-en", [folder / "train.jsonl"], 1


def _write_hf_jsonl(folder: Path, train) -> tuple[str, list[Path], int]:
    for split, rows in (("train", train), ("validation", DEV), ("test", TEST)):
        (folder / f"{split}.jsonl").write_bytes(_jsonl(rows, ("source", "target")))
    return f"hf:{folder}", [folder / "train.jsonl"], 1


def _write_hf_csv(folder: Path, train) -> tuple[str, list[Path], int]:
    for split, rows in (("train", train), ("validation", DEV), ("test", TEST)):
        (folder / f"{split}.csv").write_bytes(("source,target\n" + "".join(f"{s},{t}\n" for s, t in rows)).encode())
    return f"hf:{folder}", [folder / "train.csv"], 2  # line 1: the header


READERS = {
    "text": _write_text,
    "tsv": _write_tsv,
    "jsonl": _write_jsonl,
    "hf-jsonl": _write_hf_jsonl,
    "hf-csv": _write_hf_csv,
}


def _corpus(reader: str, tmp_path: Path, train=TRAIN) -> tuple[str, list[Path], int]:
    folder = tmp_path / reader
    folder.mkdir()
    return READERS[reader](folder, train)


def _load(spec: str, tmp_path: Path, **kwargs):
    return load_corpus(spec, cache_dir=tmp_path / "cache", **kwargs)


def _pairs(dataset) -> list[tuple[str, str]]:
    return list(zip(dataset["source"], dataset["target"]))


def _place(data: bytes, offset: int) -> tuple[int, int]:
    """(line, character column) of byte ``offset`` of ``data``, both from 1, as an editor shows them."""
    start = data.rfind(b"\n", 0, offset) + 1
    return data.count(b"\n", 0, offset) + 1, len(data[start:offset].decode("utf-8")) + 1


# ------------------------------------------------------------------------------ benign faults
BENIGN = {
    "CRLF": lambda data: data.replace(b"\n", b"\r\n"),
    "BOM": lambda data: b"\xef\xbb\xbf" + data,
    "CRLF and BOM": lambda data: b"\xef\xbb\xbf" + data.replace(b"\n", b"\r\n"),
}


def test_the_clean_corpus_reads_as_written(tmp_path):
    """The baseline the faults are measured against, for every reader."""
    for reader in READERS:
        spec, _, _ = _corpus(reader, tmp_path)
        corpus = _load(spec, tmp_path)
        assert _pairs(corpus["train"]) == TRAIN, reader
        assert _pairs(corpus["validation"]) == DEV and _pairs(corpus["test"]) == TEST, reader


@pytest.mark.parametrize("fault", sorted(BENIGN))
@pytest.mark.parametrize("reader", sorted(READERS))
def test_crlf_and_a_bom_give_the_pairs_of_the_clean_file(tmp_path, reader, fault):
    spec, files, _ = _corpus(reader, tmp_path)
    for path in files:
        path.write_bytes(BENIGN[fault](path.read_bytes()))
    assert b"\r\n" in files[0].read_bytes() or files[0].read_bytes().startswith(b"\xef\xbb\xbf")
    corpus = _load(spec, tmp_path)
    assert _pairs(corpus["train"]) == TRAIN  # no "\r" at a line end, no "\ufeff" before line 1


@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_10_mb_line_is_read_in_linear_time_and_the_length_filter_drops_it(tmp_path, reader):
    train = [*TRAIN[:FAULTY_ROW], (LONG, TRAIN[FAULTY_ROW][1]), *TRAIN[FAULTY_ROW + 1 :]]
    spec, files, _ = _corpus(reader, tmp_path, train)
    assert max(len(line) for line in files[0].read_bytes().split(b"\n")) >= 10_000_000
    started = time.monotonic()
    corpus = _load(spec, tmp_path)
    assert time.monotonic() - started < 30  # quadratic reading of 10 MB would take hours
    expected = [*TRAIN[:FAULTY_ROW], (LONG.strip(), TRAIN[FAULTY_ROW][1]), *TRAIN[FAULTY_ROW + 1 :]]
    assert _pairs(corpus["train"]) == expected  # the whole line, whitespace folded by the cleaning
    filtered, info = _load(spec, tmp_path, filters={"max_length": 50}, return_info=True)
    assert _pairs(filtered["train"]) == TRAIN[:FAULTY_ROW] + TRAIN[FAULTY_ROW + 1 :]
    assert info.counts["train"]["too_long"] == 1


def test_blank_lines_at_the_end_of_one_line_aligned_file_pair_with_nothing(tmp_path):
    spec, (source, target), _ = _corpus("text", tmp_path)
    target.write_bytes(target.read_bytes() + b"\n\n \n")  # an editor's extra newlines
    assert _pairs(_load(spec, tmp_path)["train"]) == TRAIN


def test_blank_lines_in_a_tsv_file_hold_no_pair(tmp_path):
    spec, (path,), _ = _corpus("tsv", tmp_path)
    lines = path.read_bytes().split(b"\n")
    path.write_bytes(b"\n".join([*lines[:2], b"", *lines[2:]]) + b"\n\n")
    assert _pairs(_load(spec, tmp_path)["train"]) == TRAIN


# ------------------------------------------------------------------------------- fatal faults
def _spoil(data: bytes, bad: bytes) -> tuple[bytes, int]:
    """``data`` with the "Z" of "Zug" (TRAIN[2]'s source) replaced by ``bad``; and that offset."""
    offset = data.index("Zug".encode())
    return data[:offset] + bad + data[offset + 1 :], offset


ENCODING_FAULTS = {
    "invalid UTF-8": (b"\xff", "not UTF-8 (byte 0xff at column {column}); save the file as UTF-8"),
    "a NUL byte": (b"\x00", "a NUL byte at column {column} (a binary or UTF-16 file?); save the file as UTF-8 text"),
}


@pytest.mark.parametrize("fault", sorted(ENCODING_FAULTS))
@pytest.mark.parametrize("reader", sorted(READERS))
def test_invalid_utf8_and_a_nul_byte_are_one_line_naming_file_line_and_column(tmp_path, reader, fault):
    spec, files, _ = _corpus(reader, tmp_path)
    bad, message = ENCODING_FAULTS[fault]
    data, offset = _spoil(files[0].read_bytes(), bad)
    files[0].write_bytes(data)
    line, column = _place(data, offset)
    assert column < offset - data.rfind(b"\n", 0, offset)  # "Ü", "ü", "ä" before it: characters, not bytes
    with pytest.raises(CorpusError) as caught:
        _load(spec, tmp_path)
    assert str(caught.value) == f"{files[0]} line {line}: " + message.format(column=column)


@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_utf16_file_is_one_line_saying_so(tmp_path, reader):
    spec, files, _ = _corpus(reader, tmp_path)
    files[0].write_bytes(files[0].read_bytes().decode("utf-8").encode("utf-16"))  # with its BOM
    with pytest.raises(CorpusError) as caught:
        _load(spec, tmp_path)
    assert str(caught.value) == (
        f"{files[0]} line 1: the file is UTF-16 (it starts with a UTF-16 byte-order mark); save the file as UTF-8"
    )


EMPTY = {
    "text": "no train pairs: {source} and {target} are empty; give one sentence per line in each",
    "tsv": "{source}: no pairs in it (the file is empty); give one pair per line, source and target tab-separated",
    "jsonl": '{source}: no pairs in it (the file is empty); give one JSON object per line, e.g. {{"de": "...", ',
    "hf-jsonl": "{source}: no rows in it (the file is empty); give one row per pair, or remove the file",
    "hf-csv": "{source}: no rows in it (the file is empty); give one row per pair, or remove the file",
}


@pytest.mark.parametrize("reader", sorted(READERS))
def test_an_empty_file_is_one_line_naming_it(tmp_path, reader):
    spec, files, _ = _corpus(reader, tmp_path)
    for path in files:
        path.write_bytes(b"")
    with pytest.raises(CorpusError) as caught:
        _load(spec, tmp_path)
    expected = EMPTY[reader].format(source=files[0], target=files[-1])
    assert str(caught.value).startswith(expected) and "\n" not in str(caught.value), str(caught.value)


# Source and target that do not pair up: per reader, how the train file is cut, and the message.
def _drop_last_target_line(files, first_line):
    target = files[-1]
    target.write_bytes(b"".join(target.read_bytes().splitlines(keepends=True)[:-1]))


def _drop_target_of_row_2(files, first_line):
    path = files[0]
    lines = path.read_bytes().splitlines(keepends=True)
    row = first_line - 1 + FAULTY_ROW
    if path.suffix == ".tsv":
        lines[row] = lines[row].split(b"\t")[0] + b"\n"
    elif path.suffix == ".csv":
        lines[row] = lines[row].split(b",")[0] + b",\n"
    else:
        key = "en" if "hf" not in path.parent.name else "target"
        record = json.loads(lines[row])
        lines[row] = (json.dumps({k: v for k, v in record.items() if k != key}) + "\n").encode()
    path.write_bytes(b"".join(lines))


MISMATCH = {
    "text": (
        _drop_last_target_line,
        "line-aligned files differ in length: {source} has 5 lines, {target} has 4 lines "
        "({source} line 5 has no partner); each line of one file must be the translation of the same line "
        "of the other",
    ),
    "tsv": (
        _drop_target_of_row_2,
        "{source}, line 3: expected at least 2 tab-separated columns (src_col=0, tgt_col=1), found 1: ",
    ),
    "jsonl": (_drop_target_of_row_2, "{source}, line 3: key 'en' is missing; keys on this line: ['de']"),
    "hf-jsonl": (
        _drop_target_of_row_2,
        "dataset '{folder}' split 'train' row 2 (counting from 0): 'target' is missing (null); "
        "every row needs a source and a target string",
    ),
    "hf-csv": (
        _drop_target_of_row_2,
        "dataset '{folder}' split 'train' row 2 (counting from 0): 'target' is missing (null); "
        "every row needs a source and a target string",
    ),
}


@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_source_without_its_target_is_one_line_naming_the_file_and_line(tmp_path, reader):
    spec, files, first_line = _corpus(reader, tmp_path)
    cut, message = MISMATCH[reader]
    cut(files, first_line)
    with pytest.raises(CorpusError) as caught:
        _load(spec, tmp_path)
    expected = message.format(source=files[0], target=files[-1], folder=files[0].parent)
    assert str(caught.value).startswith(expected) and "\n" not in str(caught.value), str(caught.value)


def test_a_tab_inside_a_tsv_sentence_is_one_line_not_a_shifted_pair(tmp_path):
    spec, (path,), _ = _corpus("tsv", tmp_path)
    data = path.read_bytes().replace("fährt ein Zug.".encode(), "fährt\tein Zug.".encode())
    path.write_bytes(data)
    with pytest.raises(CorpusError) as caught:
        _load(spec, tmp_path)
    assert str(caught.value).startswith(
        f"{path}, line 3: 3 tab-separated columns, but line 1 has 2 (a tab inside a sentence?): "
    ) and str(caught.value).endswith("; give every line the same columns")


@pytest.mark.parametrize("reader", sorted(READERS))
def test_the_command_line_shows_a_hostile_corpus_as_one_error_line(tmp_path, capsys, reader):
    from attention_seq2seq.cli import main

    spec, files, _ = _corpus(reader, tmp_path)
    data, offset = _spoil(files[0].read_bytes(), b"\xff")
    files[0].write_bytes(data)
    line, column = _place(data, offset)
    # evaluate reads its test set before it loads the model: no model is needed to see the corpus fault
    argv = ["evaluate", "-m", str(tmp_path / "no-model"), "--corpus", spec, "--split", "test"]
    error = one_line_error(capsys, main, argv)
    assert error.endswith(
        f"error: {files[0]} line {line}: not UTF-8 (byte 0xff at column {column}); save the file as UTF-8"
    )


# ---------------------------------------------------------------------------- model folders
@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    """A save_pretrained folder of an untrained tiny Transformer with its tokenizer (no training)."""
    tokenizer = build_tokenizer(read_pairs(60))
    folder = tmp_path_factory.mktemp("hostile-model") / "model"
    tiny_model("transformer_seq2seq", len(tokenizer), seed=0, eval=True).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _copy(model_folder: Path, tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    shutil.copytree(model_folder, folder)
    return folder


def _translate_error(capsys, folder: Path) -> str:
    from attention_seq2seq.cli import main

    return one_line_error(capsys, main, ["translate", "-m", str(folder), "--greedy", "--max-new-tokens", "3", "Hund."])


def test_the_intact_model_folder_translates(model_folder, capsys):
    from attention_seq2seq.cli import main

    assert main(["translate", "-m", str(model_folder), "--greedy", "--max-new-tokens", "3", "Hund."]) == 0
    assert "error:" not in capsys.readouterr().err


@pytest.mark.parametrize("keep", [0, 4, 100, "half", "all but one byte"])
def test_a_cut_model_safetensors_is_one_line(model_folder, tmp_path, capsys, keep):
    folder = _copy(model_folder, tmp_path, "cut")
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    size = {"half": len(data) // 2, "all but one byte": len(data) - 1}.get(keep, keep)
    weights.write_bytes(data[:size])
    error = _translate_error(capsys, folder)
    assert f"error: cannot load model {folder}: its model.safetensors is damaged or cut short (" in error
    assert error.endswith("; copy or export the folder again")


def test_a_config_json_of_bert_is_one_line(model_folder, tmp_path, capsys):
    from transformers import BertConfig

    folder = _copy(model_folder, tmp_path, "bert")
    (folder / "config.json").unlink()
    BertConfig(num_hidden_layers=1, hidden_size=16, num_attention_heads=2, intermediate_size=16).save_pretrained(folder)
    error = _translate_error(capsys, folder)
    assert error.endswith(
        f"error: cannot load model {folder}: its config.json is a 'bert' model, not an encoder-decoder; "
        "give a folder of this package's models (or another seq2seq model)"
    )


def _marian_config(vocab_size: int):
    from transformers import MarianConfig

    sizes = dict(d_model=8, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2)
    ids = dict(pad_token_id=0, decoder_start_token_id=0, bos_token_id=1, eos_token_id=2)
    return MarianConfig(vocab_size=vocab_size, encoder_ffn_dim=16, decoder_ffn_dim=16, **sizes, **ids)


def test_a_marian_config_over_this_packages_weights_is_one_line_not_a_random_model(model_folder, tmp_path, capsys):
    """A Marian config.json loads a MarianMTModel, and transformers would start the tensors it
    does not find in the file at random (a warning table, then garbage translations)."""
    folder = _copy(model_folder, tmp_path, "marian-config")
    vocab_size = json.loads((folder / "config.json").read_text())["vocab_size"]
    (folder / "config.json").unlink()
    _marian_config(vocab_size).save_pretrained(folder)
    error = _translate_error(capsys, folder)
    assert f"error: cannot load model {folder}: its model.safetensors lacks 8 of the tensors its config.json " in error
    assert "(a 'marian' model) needs (first: model.decoder.layers.0.fc1.bias)" in error
    assert error.endswith("the weights and config.json belong to different models: copy or export the folder again")


def test_a_marian_config_that_does_not_build_is_one_user_error(model_folder, tmp_path):
    from transformers import MarianConfig

    from attention_seq2seq.common.errors import UserError
    from attention_seq2seq.translation.loading import load_for_inference

    folder = _copy(model_folder, tmp_path, "marian-default")
    (folder / "config.json").unlink()
    MarianConfig(d_model=8, encoder_layers=1, decoder_layers=1, vocab_size=50).save_pretrained(folder)  # pad id 58100
    with pytest.raises(UserError) as caught:
        load_for_inference(folder, device="cpu")
    assert str(caught.value).startswith(
        f"cannot load model {folder}: the 'marian' model its config.json describes does not build ("
    )


def test_a_genuine_marian_folder_still_loads(model_folder, tmp_path):
    from transformers import MarianMTModel

    from attention_seq2seq.translation.loading import load_for_inference

    folder = tmp_path / "marian"
    vocab_size = json.loads((model_folder / "config.json").read_text())["vocab_size"]
    MarianMTModel(_marian_config(vocab_size)).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(model_folder / name, folder / name)
    assert type(load_for_inference(folder, device="cpu").model).__name__ == "MarianMTModel"


def test_a_tokenizer_larger_than_the_embeddings_is_one_line(model_folder, tmp_path, capsys):
    from transformers import PreTrainedTokenizerFast

    folder = _copy(model_folder, tmp_path, "foreign-tokenizer")
    vocab_size = json.loads((folder / "config.json").read_text())["vocab_size"]
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    tokenizer.add_tokens([f"extra{i}" for i in range(vocab_size + 5 - len(tokenizer))])
    tokenizer.save_pretrained(folder)
    error = _translate_error(capsys, folder)
    assert error.endswith(
        f"error: cannot load model {folder}: its tokenizer has {vocab_size + 5} tokens but the model's embeddings "
        f"have {vocab_size} rows (config.json vocab_size); the tokenizer files belong to another model"
    )


def test_a_cut_tokenizer_json_is_one_line(model_folder, tmp_path, capsys):
    folder = _copy(model_folder, tmp_path, "cut-tokenizer")
    text = (folder / "tokenizer.json").read_text(encoding="utf-8")
    (folder / "tokenizer.json").write_text(text[: len(text) // 2], encoding="utf-8")
    error = _translate_error(capsys, folder)
    assert f"error: cannot load model {folder}: its tokenizer files (tokenizer.json, tokenizer_config.json) " in error
    assert "do not load (" in error and error.endswith("copy or export the folder again")


# ------------------------------------------------------------------------------ hostile files
HOSTILE = {
    "invalid UTF-8": (
        b"Ein Hund.\nEin \xff Haus.\n",
        "line 2: not UTF-8 (byte 0xff at column 5); save the file as UTF-8",
    ),
    "NUL byte": (b"Ein Hund.\nEin\x00Haus.\n", "line 2: a NUL byte at column 4 (a binary or UTF-16 file?)"),
}
TEXT_BENIGN = {"CRLF": b"Ein Hund.\r\nEine Katze.\r\n", "BOM": b"\xef\xbb\xbfEin Hund.\nEine Katze.\n"}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_text_readers_name_the_file_and_line_of_a_hostile_line(tmp_path, name):
    from attention_seq2seq.data.corpora import load_corpus
    from attention_seq2seq.data.spec import CorpusError, text_lines

    data, message = HOSTILE[name]
    bad = tmp_path / "bad.de"
    bad.write_bytes(data)
    with pytest.raises(CorpusError) as caught:
        list(text_lines(bad))
    assert str(caught.value) == f"{bad} {message}" or str(caught.value).startswith(f"{bad} {message}")
    # through the corpus reader of line-aligned files (text:DIR:de-en)
    for split in ("train", "validation", "test"):
        (tmp_path / f"{split}.de").write_bytes(data if split == "train" else b"Ein Hund.\n")
        (tmp_path / f"{split}.en").write_bytes(b"A dog.\nA house.\n" if split == "train" else b"A dog.\n")
    with pytest.raises(CorpusError, match=re.escape(f"train.de {message}")):
        load_corpus(f"text:{tmp_path}:de-en")


@pytest.mark.parametrize("name", sorted(TEXT_BENIGN))
def test_crlf_and_a_bom_give_the_lines_of_the_clean_file(tmp_path, name):
    from attention_seq2seq.data.spec import text_lines

    path = tmp_path / "in.txt"
    path.write_bytes(TEXT_BENIGN[name])
    assert list(text_lines(path)) == ["Ein Hund.", "Eine Katze."]


def test_a_10_mb_line_and_an_empty_file_are_read(tmp_path):
    from attention_seq2seq.data.spec import text_lines

    big = tmp_path / "big.txt"
    big.write_bytes(b"Hund " * 2_000_000 + b"\nEnde\n")
    lines = list(text_lines(big))
    assert len(lines) == 2 and lines[0] == "Hund " * 2_000_000 and lines[1] == "Ende"
    (tmp_path / "empty.txt").write_bytes(b"")
    assert list(text_lines(tmp_path / "empty.txt")) == []


@pytest.fixture(scope="module")
def tiny_model_folder(tmp_path_factory):
    from helpers import build_tiny_run

    return build_tiny_run("rnn_seq2seq", tmp_path_factory.mktemp("hostile"))


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_translate_and_evaluate_refuse_a_hostile_input_in_one_line(tiny_model_folder, tmp_path, capsys, name):
    from attention_seq2seq.cli import main

    data, message = HOSTILE[name]
    bad = tmp_path / "in.txt"
    bad.write_bytes(data)
    ref = tmp_path / "ref.txt"
    ref.write_text("A dog.\nA house.\n", encoding="utf-8")
    options = ["--greedy", "--max-new-tokens", "4", "--no-progress"]
    assert main(["translate", "-m", str(tiny_model_folder), "-i", str(bad), "-o", str(tmp_path / "o"), *options]) == 2
    assert main(["evaluate", "-m", str(tiny_model_folder), "--src", str(bad), "--ref", str(ref), *options]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 2 and all(line.endswith(f"{bad} {message}") or f"{bad} {message}" in line for line in errors)


@pytest.mark.parametrize("same_as", ["--input", "--output"])
def test_alignments_never_overwrite_the_input_nor_share_the_output(tiny_model_folder, tmp_path, capsys, same_as):
    from attention_seq2seq.cli import main

    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("Ein Hund.\nEin Haus.\n", encoding="utf-8")
    target = source if same_as == "--input" else output
    argv = ["translate", "-m", str(tiny_model_folder), "-i", str(source), "-o", str(output), "--alignments"]
    assert main([*argv, str(target), "--greedy", "--max-new-tokens", "4", "--no-progress"]) == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert f"--alignments is the {same_as} file" in line
    assert source.read_text(encoding="utf-8") == "Ein Hund.\nEin Haus.\n" and not output.exists()


def test_evaluate_refuses_mismatched_line_counts_naming_both_files(tiny_model_folder, tmp_path, capsys):
    from attention_seq2seq.cli import main

    (tmp_path / "src.txt").write_text("Ein Hund.\nEine Katze.\nEin Haus.\n", encoding="utf-8")
    (tmp_path / "ref.txt").write_text("A dog.\n", encoding="utf-8")
    argv = ["evaluate", "-m", str(tiny_model_folder), "--src", str(tmp_path / "src.txt")]
    assert main([*argv, "--ref", str(tmp_path / "ref.txt"), "--greedy", "--no-progress"]) == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert "--src has 3 lines but --ref has 1" in line and "src.txt" in line and "ref.txt" in line


def _one_error_of(err: str) -> str:
    (line,) = [line for line in err.splitlines() if "error:" in line]
    return line


def _one_error(capsys) -> str:
    return _one_error_of(capsys.readouterr().err)


_QUICK = ["--greedy", "--max-new-tokens", "4", "--no-progress"]


def _test_files(tmp_path: Path) -> tuple[Path, Path]:
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("Ein Hund.\nEin Haus.\n", encoding="utf-8")
    ref.write_text("A dog.\nA house.\n", encoding="utf-8")
    return src, ref


@pytest.mark.parametrize("option", ["--output", "--hypotheses", "--per-sentence"])
@pytest.mark.parametrize("same_as", ["--src", "--ref"])
def test_evaluate_never_writes_over_its_test_set(tiny_model_folder, tmp_path, capsys, option, same_as):
    from attention_seq2seq.cli import main

    src, ref = _test_files(tmp_path)
    target = src if same_as == "--src" else ref
    argv = ["evaluate", "-m", str(tiny_model_folder), "--src", str(src), "--ref", str(ref), option, str(target)]
    assert main([*argv, *_QUICK]) == 2
    assert f"{option} is the {same_as} file" in _one_error(capsys)
    assert src.read_text(encoding="utf-8") == "Ein Hund.\nEin Haus.\n"
    assert ref.read_text(encoding="utf-8") == "A dog.\nA house.\n"


@pytest.mark.parametrize(
    "command,option",
    [
        ("translate", "--output"),
        ("translate", "--alignments"),
        ("evaluate", "--output"),
        ("evaluate", "--hypotheses"),
        ("evaluate", "--per-sentence"),
    ],
)
def test_an_output_that_is_a_folder_is_one_line_and_leaves_it_as_it_was(
    tiny_model_folder, tmp_path, capsys, command, option
):
    from attention_seq2seq.cli import main

    src, ref = _test_files(tmp_path)
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "kept.txt").write_text("kept\n", encoding="utf-8")
    files = ["-i", str(src)] if command == "translate" else ["--src", str(src), "--ref", str(ref)]
    extra = ["-o", str(tmp_path / "out.txt")] if option == "--alignments" else []
    assert main([command, "-m", str(tiny_model_folder), *files, *extra, option, str(folder), *_QUICK]) == 2
    assert f"{option} {folder} is a folder; give a file name" in _one_error(capsys)
    assert sorted(p.name for p in folder.iterdir()) == ["kept.txt"]  # no temporary file left in it


def test_an_input_that_is_not_a_file_says_what_it_is(tiny_model_folder, tmp_path, capsys):
    from attention_seq2seq.cli import main

    src, ref = _test_files(tmp_path)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    cases = {
        str(tmp_path): "is a folder",
        str(fifo): "is not a regular file",
        os.devnull: "is not a regular file",
        "-": "give a file name; to read standard input, leave out --input",
        str(tmp_path / "missing.txt"): "file not found",
    }
    for path, message in cases.items():
        out = tmp_path / "out.txt"
        out.write_text("kept\n", encoding="utf-8")
        assert main(["translate", "-m", str(tiny_model_folder), "-i", path, "-o", str(out), *_QUICK]) == 2, path
        line = _one_error(capsys)
        assert "--input" in line and message in line, (path, line)
        assert out.read_text(encoding="utf-8") == "kept\n"
    assert main(["evaluate", "-m", str(tiny_model_folder), "--src", str(src), "--ref", str(tmp_path), *_QUICK]) == 2
    assert f"--ref {tmp_path} is a folder" in _one_error(capsys)


def test_a_bad_line_late_in_the_input_keeps_the_existing_output(tiny_model_folder, tmp_path, capsys):
    from attention_seq2seq.cli import main

    bad = tmp_path / "in.txt"
    bad.write_bytes(b"Ein Hund.\n" * 50 + b"Ein \xff Haus.\n")
    out = tmp_path / "out.txt"
    out.write_text("yesterday's translations\n", encoding="utf-8")
    argv = ["translate", "-m", str(tiny_model_folder), "-i", str(bad), "-o", str(out), "--chunk-lines", "10"]
    assert main([*argv, *_QUICK]) == 2
    assert f"{bad} line 51: not UTF-8 (byte 0xff at column 5)" in _one_error(capsys)
    assert out.read_text(encoding="utf-8") == "yesterday's translations\n"


def test_a_bad_line_on_standard_input_is_named_like_a_file_s(tiny_model_folder, capsys, monkeypatch):
    import io

    from attention_seq2seq.cli import main

    stdin = io.TextIOWrapper(io.BytesIO(b"Ein Hund.\r\nEin \xff Haus.\n"), encoding="latin-1")  # any locale
    monkeypatch.setattr(sys, "stdin", stdin)
    assert main(["translate", "-m", str(tiny_model_folder), "--chunk-lines", "1", *_QUICK]) == 2
    captured = capsys.readouterr()
    assert "standard input line 2: not UTF-8 (byte 0xff at column 5)" in _one_error_of(captured.err)
    assert len(captured.out.splitlines()) == 1  # the first chunk (one line) was translated before the bad one


def test_resume_refuses_an_output_longer_than_its_input(tiny_model_folder, tmp_path, capsys):
    from attention_seq2seq.cli import main

    src, _ = _test_files(tmp_path)
    out = tmp_path / "out.txt"
    assert main(["translate", "-m", str(tiny_model_folder), "-i", str(src), "-o", str(out), *_QUICK]) == 0
    before = out.read_bytes()
    src.write_text("Ein Hund.\n", encoding="utf-8")
    assert main(["translate", "-m", str(tiny_model_folder), "-i", str(src), "-o", str(out), "--resume", *_QUICK]) == 2
    line = _one_error(capsys)
    assert "holds 2 complete source(s) but the input has only 1 line(s)" in line and "without --resume" in line
    assert out.read_bytes() == before


def test_a_device_as_output_is_written_not_replaced(tiny_model_folder, tmp_path, capsys):
    from attention_seq2seq.cli import main

    src, ref = _test_files(tmp_path)
    assert main(["translate", "-m", str(tiny_model_folder), "-i", str(src), "-o", os.devnull, *_QUICK]) == 0
    assert (
        main(
            ["evaluate", "-m", str(tiny_model_folder), "--src", str(src), "--ref", str(ref), "-o", os.devnull, *_QUICK]
        )
        == 0
    )
    assert Path(os.devnull).is_char_device()
    if Path("/dev/full").is_char_device():
        assert main(["translate", "-m", str(tiny_model_folder), "-i", str(src), "-o", "/dev/full", *_QUICK]) == 2
        assert "no space left writing the translations (/dev/full: " in _one_error(capsys)
        assert (
            main(
                [
                    "evaluate",
                    "-m",
                    str(tiny_model_folder),
                    "--src",
                    str(src),
                    "--ref",
                    str(ref),
                    "-o",
                    "/dev/full",
                    *_QUICK,
                ]
            )
            == 2
        )
        captured = capsys.readouterr()
        assert "BLEU" in captured.out  # the scores are printed before the write that fails
        assert "no space left writing the scores (/dev/full: " in captured.err
        assert Path("/dev/full").is_char_device()


def test_an_unwritable_output_folder_is_refused_before_translating(tiny_model_folder, tmp_path, capsys, monkeypatch):
    from attention_seq2seq.cli import main
    from attention_seq2seq.common import user_files

    src, ref = _test_files(tmp_path)
    locked = tmp_path / "locked"
    locked.mkdir()
    # root passes permission bits: stand in for a read-only file system at the probe itself
    monkeypatch.setattr(
        user_files, "unwritable", lambda folder: "Read-only file system" if Path(folder) == locked else None
    )
    out = locked / "out.txt"
    assert main(["translate", "-m", str(tiny_model_folder), "-i", str(src), "-o", str(out), *_QUICK]) == 2
    assert f"--output {out}: cannot write there (Read-only file system)" in _one_error(capsys)
    argv = ["evaluate", "-m", str(tiny_model_folder), "--src", str(src), "--ref", str(ref)]
    assert main([*argv, "--hypotheses", str(locked / "h" / "hyp.txt"), *_QUICK]) == 2
    assert f"--hypotheses {locked / 'h' / 'hyp.txt'}: cannot write there (Read-only file system)" in _one_error(capsys)
    assert not (locked / "h").exists()  # checked at the nearest existing folder; nothing made


def test_a_file_the_system_refuses_late_is_one_line_after_the_scores(tiny_model_folder, tmp_path, capsys):
    """An OSError no check foresaw (here the run's metrics.json is a folder) is one line naming the
    file, not a traceback, and the scores were printed before it."""
    from attention_seq2seq.cli import main

    src, ref = _test_files(tmp_path)
    run = tmp_path / "run"
    shutil.copytree(tiny_model_folder, run)
    (run / "metrics.json").unlink(missing_ok=True)
    (run / "metrics.json").mkdir()
    argv = ["evaluate", "-m", str(run), "--src", str(src), "--ref", str(ref), "--update-metrics", *_QUICK]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "BLEU" in captured.out and "Traceback" not in captured.err
    (line,) = [line for line in captured.err.splitlines() if "error:" in line]
    assert line.endswith(f"{run / 'metrics.json'}: Is a directory"), line
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".metrics")) == []  # no temporary file left


def _spoil_generation_config(folder: Path) -> None:
    (folder / "generation_config.json").write_text('{"num_beams": 5,', encoding="utf-8")


def _relabel_as_the_other_family(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    assert config["model_type"] == "rnn_seq2seq"
    config["architectures"] = ["TransformerSeq2SeqForConditionalGeneration"]
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")


QUIET_FOLDER_FAULTS = {
    "damaged generation_config.json": (
        _spoil_generation_config,
        "its generation_config.json does not load",
    ),
    "config.json of the other family": (
        _relabel_as_the_other_family,
        "says model_type 'rnn_seq2seq' (the rnn family) but architectures 'TransformerSeq2SeqForConditionalGeneration' "
        "(the transformer family",
    ),
    "no tokenizer.json": (lambda folder: (folder / "tokenizer.json").unlink(), "its tokenizer.json is missing"),
}


@pytest.mark.parametrize("name", sorted(QUIET_FOLDER_FAULTS))
def test_a_model_folder_fault_transformers_passes_over_is_one_line(tiny_model_folder, tmp_path, capsys, name):
    """A damaged generation_config.json made transformers decode with its defaults (other
    translations, a warning at most); the other two failed with messages about something else."""
    from attention_seq2seq.cli import main

    spoil, message = QUIET_FOLDER_FAULTS[name]
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_folder / "model", folder)
    spoil(folder)
    assert main(["translate", "-m", str(folder), "Ein Hund.", *_QUICK]) == 2
    line = _one_error(capsys)
    assert f"cannot load model {folder}: " in line and message in line, line


def test_broken_model_folders_are_one_line_naming_what_is_wrong(tiny_model_folder, tmp_path, capsys):
    from transformers import BertConfig, PreTrainedTokenizerFast

    from attention_seq2seq.cli import main

    cut = tmp_path / "cut"
    shutil.copytree(tiny_model_folder / "model", cut)
    data = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(data[: len(data) // 2])
    other = tmp_path / "other"
    shutil.copytree(tiny_model_folder / "model", other)
    (other / "config.json").unlink()
    BertConfig(num_hidden_layers=1, hidden_size=16, num_attention_heads=2, intermediate_size=16).save_pretrained(other)
    shapes = tmp_path / "shapes"
    shutil.copytree(tiny_model_folder / "model", shapes)
    config = json.loads((shapes / "config.json").read_text())
    config["vocab_size"] = 10
    (shapes / "config.json").write_text(json.dumps(config))
    foreign = tmp_path / "foreign"
    shutil.copytree(tiny_model_folder / "model", foreign)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(foreign)
    vocab_size = json.loads((foreign / "config.json").read_text())["vocab_size"]
    tokenizer.add_tokens([f"extra{i}" for i in range(vocab_size + 5 - len(tokenizer))])
    tokenizer.save_pretrained(foreign)
    expected = {
        cut: "its model.safetensors is damaged or cut short",
        other: "its config.json is a 'bert' model, not an encoder-decoder",
        shapes: "the tensors of its model.safetensors do not have the shapes its config.json describes",
        foreign: f"its tokenizer has {vocab_size + 5} tokens but the model's embeddings have {vocab_size} rows",
    }
    for folder, text in expected.items():
        assert main(["translate", "-m", str(folder), "--greedy", "Ein Hund."]) == 2, folder
        (line,) = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
        assert f"cannot load model {folder}: " in line and text in line, line


@pytest.mark.parametrize("kind", ["tsv", "jsonl"])
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_tsv_and_jsonl_corpora_name_the_file_and_line_of_a_hostile_line(tmp_path, kind, name):
    from attention_seq2seq.data.corpora import load_corpus
    from attention_seq2seq.data.spec import CorpusError

    bad_line = HOSTILE[name][0].split(b"\n")[1]  # b"Ein \xff Haus." or b"Ein\x00Haus."
    if kind == "tsv":
        good, bad = b"Ein Hund.\tA dog.\n", bad_line + b"\tA house.\n"
    else:
        good, bad = b'{"de": "Ein Hund.", "en": "A dog."}\n', b'{"de": "' + bad_line + b'", "en": "A house."}\n'
    path = tmp_path / f"pairs.{kind}"
    path.write_bytes(b"\xef\xbb\xbf" + good + bad + good * 30)  # a BOM too: not the fault
    column = {"tsv": 0, "jsonl": 8}[kind]  # where the bad line starts inside the row
    byte = 4 if name == "invalid UTF-8" else 3
    expected = f"{path} line 2: " + (
        f"not UTF-8 (byte 0xff at column {column + byte + 1})"
        if name == "invalid UTF-8"
        else f"a NUL byte at column {column + byte + 1}"
    )
    with pytest.raises(CorpusError, match=re.escape(expected)):
        load_corpus(f"{kind}:{path}:de-en")
