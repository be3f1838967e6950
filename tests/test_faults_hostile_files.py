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
import shutil
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

    from attention_seq2seq.errors import UserError
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
