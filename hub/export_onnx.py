"""Export either family as ONNX graphs (``pip install attention-seq2seq[onnx]``).

``export_onnx(run, folder)`` writes::

    folder/
      encoder.onnx, decoder.onnx     the two graphs of hub/onnx_graphs.py (float32, or int8 weights
                                     with ``quantization="int8"``: onnxruntime's dynamic quantization)
      attention_seq2seq_onnx.json    the graphs' interface, the decoding defaults, the check's result
      onnx_runtime.py                the decoder loop (greedy, beam search, n-best), numpy +
                                     onnxruntime only: ``python onnx_runtime.py FOLDER < input``
      tokenizer.json, ...            the tokenizer; generation_config.json
      README.md                      how to run it, with and without this package

The graphs are traced (``torch.onnx.export``, TorchScript exporter, opset 17) from the model in
eval mode, float32, eager attention, the CPU fast paths off. Before anything is written, both
graphs run in onnxruntime on a padded batch of sentences, and every logit of a greedy decode of
it (the encoder once, then each step teacher-forced on PyTorch's own greedy tokens) must lie within
``CHECK_TOLERANCE`` of the PyTorch model's; otherwise the export is refused naming the graph and
the difference. With int8 the check runs on the float32 graphs (quantization changes the numbers
on purpose); the int8 graphs are then checked to run.

Refused, one line each: a model type that is not ours, and decoding defaults in
``generation_config.json`` the runtime does not implement (repetition penalties, n-gram blocking,
forced or suppressed tokens, ``min_length``, sampling; ``min_new_tokens`` is carried): the
PyTorch model or CTranslate2 run those.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from pathlib import Path

import torch

from ..common.durability import write_atomically
from .export import (
    ExportError,
    _check_destination,
    _load_model_and_tokenizer,
    _read_mapping,
    family_of,
    resolve_sources,
)
from .model_card import fill, template_sections, test_scores
from .onnx_graphs import dynamic_axes, graph_interface, graphs_of
from .shipped_code import shipped_files, write_files

QUANTIZATIONS = ("float32", "int8")
OPSET = 17
#: The largest |logit difference| the export accepts between onnxruntime and PyTorch (float32).
CHECK_TOLERANCE = 1e-4
#: The runtime module shipped in the folder (hub/shipped_code.py), and what it may import besides the standard library.
RUNTIME_MODULE = "attention_seq2seq.translation.onnx_runtime"
RUNTIME_PACKAGES = ("numpy", "onnxruntime", "tokenizers")

# Generation settings that need a logits processor or sampling, which the runtime does not have:
# name -> the value that means "off".
_UNSUPPORTED_GENERATION = {"do_sample": False, "repetition_penalty": 1.0, "num_beam_groups": 1}
_UNSUPPORTED_GENERATION |= dict.fromkeys(
    "no_repeat_ngram_size encoder_no_repeat_ngram_size min_length diversity_penalty".split(), 0
)
_UNSUPPORTED_GENERATION |= dict.fromkeys(
    "bad_words_ids forced_bos_token_id forced_eos_token_id suppress_tokens begin_suppress_tokens "
    "exponential_decay_length_penalty sequence_bias".split()
)


class OnnxExportRefused(ExportError):
    """The model or its decoding defaults cannot be carried by the ONNX export; the message names it."""


def _import_onnx():
    try:
        import onnx  # noqa: F401
        import onnxruntime
    except ImportError:
        raise ExportError("--format onnx needs onnx and onnxruntime: pip install 'attention-seq2seq[onnx]'") from None
    return onnxruntime


def check_generation_config(generation_config) -> None:
    """Refuse decoding defaults the ONNX runtime does not implement, naming the first one.

    Raises:
        OnnxExportRefused: e.g. ``no_repeat_ngram_size=3``.
    """
    for name, off in _UNSUPPORTED_GENERATION.items():
        value = getattr(generation_config, name, off)
        if value is not None and value != off and value != []:
            raise OnnxExportRefused(
                f"generation_config.json sets {name}={value!r}, which the ONNX runtime does not implement "
                "(it runs greedy and beam search with a length penalty); unset it, or translate with the "
                "PyTorch model (--format remote)"
            )


def generation_defaults(model) -> dict:
    """The decoding defaults the runtime reads (from the model's ``generation_config``)."""
    from ..modeling.generation_lengths import eos_token_ids

    config = model.generation_config
    positions = (
        getattr(model.config, "max_position_embeddings", None) if model.config.model_type != "rnn_seq2seq" else None
    )
    return {
        "decoder_start_token_id": int(config.decoder_start_token_id),
        "eos_token_id": sorted(eos_token_ids(config)),
        "pad_token_id": int(config.pad_token_id),
        "num_beams": int(config.num_beams or 1),
        "max_new_tokens": int(config.max_new_tokens) if config.max_new_tokens is not None else None,
        "max_length": int(config.max_length) if config.max_length is not None else None,
        "length_penalty": float(1.0 if config.length_penalty is None else config.length_penalty),
        "early_stopping": config.early_stopping,
        "min_new_tokens": int(config.min_new_tokens) if config.min_new_tokens else None,
        "max_decoder_positions": positions,
    }


def synthetic_sentences(tokenizer, count: int = 6, seed: int = 0) -> list[list[int]]:
    """``count`` token-id rows of varied lengths (3 to 24 pieces, ``</s>`` last) drawn from the
    vocabulary: the check's batch when no sentences are given."""
    generator = torch.Generator().manual_seed(seed)
    special = set(tokenizer.all_special_ids)
    pieces = [i for i in range(len(tokenizer)) if i not in special]
    rows = []
    for k in range(count):
        length = 3 + (k * 7) % 22
        picks = torch.randint(len(pieces), (length,), generator=generator).tolist()
        rows.append([pieces[p] for p in picks] + [tokenizer.eos_token_id])
    return rows


def _pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        input_ids[i, : len(row)] = torch.tensor(row)
        attention_mask[i, : len(row)] = 1
    return input_ids, attention_mask


@contextlib.contextmanager
def _native_stderr_to(path: Path):
    """Send what C++ code prints on file descriptor 2 (the TorchScript exporter's shape-inference
    notes about packed sequences) to ``path`` for the duration; Python's ``sys.stderr`` is kept."""
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "wb") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _export_graphs(model, folder: Path, rows: list[list[int]]) -> dict:
    """Trace both graphs into ``folder``; returns the interface."""
    interface = graph_interface(model)
    encoder_graph, step_graph = graphs_of(model)
    input_ids, attention_mask = _pad(rows, model.config.pad_token_id)
    with torch.no_grad():
        encoder_outputs = dict(zip(interface["encoder_outputs"], encoder_graph(input_ids, attention_mask)))
        # Traced with two decoder rows per source where sources are shared, so that the graph keeps
        # the beam stacking of cross-attention (its group size stays a traced shape, any value works)
        group = 2 if interface["shared_sources"] else 1
        example = _step_inputs(interface, encoder_outputs, attention_mask, position=2, past=2, group=group)
        with warnings.catch_warnings(), _native_stderr_to(folder / "export.log"):
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer notes
            graphs = {
                "encoder": (encoder_graph, (input_ids, attention_mask)),
                "decoder": (step_graph, tuple(example[name] for name in interface["decoder_inputs"])),
            }
            for name, (graph, inputs) in graphs.items():
                input_names, output_names = interface[f"{name}_inputs"], interface[f"{name}_outputs"]
                torch.onnx.export(
                    graph,
                    inputs,
                    str(folder / f"{name}.onnx"),
                    dynamo=False,
                    opset_version=OPSET,
                    input_names=input_names,
                    output_names=output_names,
                    dynamic_axes=dynamic_axes(input_names + output_names),
                )
    (folder / "export.log").unlink()
    return interface


def _step_inputs(
    interface: dict, encoder_outputs: dict, attention_mask, position: int, past: int, tokens=None, group: int = 1
):
    """The step graph's inputs for the first decoder position (or an example with ``past`` cached
    positions and ``group`` decoder rows per source, for tracing)."""
    batch = attention_mask.size(0) * group
    inputs = dict(encoder_outputs)
    for name in interface["state"]:
        initial = interface["initial_state"][name]
        if initial != "encoder":
            inputs[name] = torch.zeros([batch if d == "batch" else (past if d == 0 else d) for d in initial])
    inputs["decoder_input_ids"] = tokens if tokens is not None else torch.ones(batch, 1, dtype=torch.long)
    inputs["position"] = torch.tensor([position])
    inputs["attention_mask"] = attention_mask
    return inputs


def check_against_pytorch(model, folder: Path, interface: dict, rows: list[list[int]], max_steps: int = 40) -> dict:
    """Run both graphs in onnxruntime and the traced modules in PyTorch on the padded ``rows``:
    the encoder outputs, then up to ``max_steps`` decoder steps teacher-forced on PyTorch's greedy
    tokens. Returns {"encoder": max |diff| of the encoder outputs, "decoder": max |diff| of the
    logits, "steps": steps compared, "sentences": len(rows)}."""
    import numpy as np

    sessions = _sessions(folder)
    encoder_graph, step_graph = graphs_of(model)
    input_ids, attention_mask = _pad(rows, model.config.pad_token_id)
    eos = set(generation_defaults(model)["eos_token_id"])
    with torch.no_grad():
        ours = dict(zip(interface["encoder_outputs"], encoder_graph(input_ids, attention_mask)))
        theirs = dict(
            zip(
                interface["encoder_outputs"],
                sessions["encoder"].run(
                    None, {"input_ids": input_ids.numpy(), "attention_mask": attention_mask.numpy()}
                ),
            )
        )
        encoder_diff = max(float(np.abs(ours[n].numpy() - theirs[n]).max()) for n in interface["encoder_outputs"])
        start = torch.full((input_ids.size(0), 1), model.config.decoder_start_token_id, dtype=torch.long)
        feed = _step_inputs(interface, ours, attention_mask, position=0, past=0, tokens=start)
        decoder_diff, steps = 0.0, 0
        done = torch.zeros(input_ids.size(0), dtype=torch.bool)
        limit = max_steps
        positions = generation_defaults(model)["max_decoder_positions"]
        if positions:
            limit = min(limit, positions)
        for t in range(limit):
            feed["position"] = torch.tensor([t])
            outputs = step_graph(*(feed[name] for name in interface["decoder_inputs"]))
            got = sessions["decoder"].run(None, {name: feed[name].numpy() for name in interface["decoder_inputs"]})
            decoder_diff = max(decoder_diff, float(np.abs(outputs[0].numpy() - got[0]).max()))
            steps += 1
            tokens = outputs[0].argmax(-1)
            done |= torch.tensor([int(token) in eos for token in tokens])
            if bool(done.all()):
                break
            feed["decoder_input_ids"] = tokens[:, None]
            for name, tensor in zip(interface["state"], outputs[2:]):
                feed[name] = tensor
    return {"encoder": encoder_diff, "decoder": decoder_diff, "steps": steps, "sentences": len(rows)}


def _quantize(folder: Path) -> None:
    """Replace both graphs by their int8 dynamic quantization (onnxruntime.quantization)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    import logging

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # its advice to run shape pre-processing first, on the root logger
    try:
        for name in ("encoder", "decoder"):
            source = folder / f"{name}.onnx"
            target = folder / f"{name}.int8.onnx"
            quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8)
            os.replace(target, source)
    finally:
        root.setLevel(level)


def export_onnx(
    src: str | os.PathLike,
    export_dir: str | os.PathLike,
    *,
    quantization: str = "float32",
    sentences: list[str] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``export_dir`` (see the module docstring) from a training run or a model folder.

    Args:
        src: a training output folder or a ``save_pretrained`` folder of either family.
        export_dir: the folder to write (must not exist or be empty unless ``overwrite``).
        quantization: "float32" or "int8" (weights of MatMul/Gemm, LSTM, ... as int8, activations
            quantized on the fly: onnxruntime's ``quantize_dynamic``).
        sentences: source sentences for the check (default: synthetic rows of the vocabulary).
        overwrite: replace a non-empty ``export_dir`` once the new export is complete.

    Raises:
        OnnxExportRefused: a decoding default the runtime does not implement (named).
        ExportError: bad source, destination or quantization; onnx/onnxruntime not installed; the
            check failed (naming the graph and the difference).
    """
    if quantization not in QUANTIZATIONS:
        raise ExportError(
            f"--quantization {quantization!r} for --format onnx: choose one of {', '.join(QUANTIZATIONS)}"
        )
    src, export_dir = Path(src), Path(export_dir)
    sources = resolve_sources(src)
    _check_destination(export_dir, src, overwrite)
    family = family_of(sources.model_dir)
    onnxruntime = _import_onnx()
    model, tokenizer = _load_model_and_tokenizer(family, sources.model_dir)
    check_generation_config(model.generation_config)
    model = model.float().eval()
    model.config.use_cpu_fast_paths = False
    if model.config.model_type != "rnn_seq2seq":
        model.config._attn_implementation = "eager"
    if sentences:
        rows = [row for row in tokenizer(list(sentences))["input_ids"] if row]
        limit = getattr(model.config, "max_position_embeddings", None)
        if limit:
            rows = [row if len(row) <= limit else row[: limit - 1] + row[-1:] for row in rows]
    else:
        rows = synthetic_sentences(tokenizer)

    def write(staging: Path) -> None:
        staging.mkdir()
        interface = _export_graphs(model, staging, rows)
        check = check_against_pytorch(model, staging, interface, rows)
        for graph in ("encoder", "decoder"):
            if not check[graph] <= CHECK_TOLERANCE:
                raise ExportError(
                    f"ONNX export check: {graph}.onnx differs from the PyTorch model by {check[graph]:.3g} "
                    f"(> {CHECK_TOLERANCE}) on {check['sentences']} sentences; export refused"
                )
        if quantization == "int8":
            _quantize(staging)
        _write_runtime_files(staging, model, tokenizer, interface, quantization, check, onnxruntime, sources)

    write_atomically(export_dir, write)
    return export_dir


def _write_runtime_files(folder, model, tokenizer, interface, quantization, check, onnxruntime, sources) -> None:
    import onnx

    from ..translation.onnx_folder import MARKER_FILE

    tokenizer.save_pretrained(folder)
    model.generation_config.save_pretrained(folder)
    marker = {
        "format": "onnx",
        "format_version": 1,
        "source_model_type": model.config.model_type,
        "quantization": quantization,
        "files": {"encoder": "encoder.onnx", "decoder": "decoder.onnx"},
        "interface": interface,
        "generation": generation_defaults(model),
        "vocab_size": model.config.vocab_size,
        "check": {**check, "tolerance": CHECK_TOLERANCE, "checked_graphs": "float32"},
        "versions": {"onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__, "torch": torch.__version__},
    }
    (folder / MARKER_FILE).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    write_files(folder, shipped_files([RUNTIME_MODULE], RUNTIME_PACKAGES))
    metrics = _read_mapping(sources.metrics, "metrics")
    (folder / "README.md").write_text(render_onnx_card(model.config, quantization, check, metrics), encoding="utf-8")
    _sessions(folder)  # the int8 graphs must open too (quantization can emit operators a build lacks)


def _sessions(folder: Path) -> dict:
    """onnxruntime sessions of the folder's two graphs, on the CPU, warnings off."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    return {
        name: onnxruntime.InferenceSession(str(folder / f"{name}.onnx"), options, providers=["CPUExecutionProvider"])
        for name in ("encoder", "decoder")
    }


def render_onnx_card(config, quantization: str, check: dict, metrics: dict | None) -> str:
    """The folder's README.md: what it holds and how to run it."""
    family = "RNN encoder-decoder" if config.model_type == "rnn_seq2seq" else "Transformer"
    scores = "\n".join(test_scores(metrics))
    scores = f"\nThe PyTorch model's test scores (the run's metrics.json):\n\n{scores}\n" if scores else ""
    values = {
        "family": family,
        "quantization": quantization,
        "sentences": check["sentences"],
        "steps": check["steps"],
        "encoder_difference": f"{check['encoder']:.2g}",
        "decoder_difference": f"{check['decoder']:.2g}",
        "scores": scores,
    }
    return fill(template_sections("onnx.md")["onnx"], values, "hub_cards/onnx.md") + "\n"
