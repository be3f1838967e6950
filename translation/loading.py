"""Load a model for inference from wherever it lives, and translate batches of sentences.

A model can be given as
- a training output folder (``<run>/model/`` holds the weights, ``<run>/metrics.json`` the scores),
- an export folder (Hub-ready: ``config.json`` with ``auto_map`` and the flattened code),
- a plain ``save_pretrained`` folder (weights, config, tokenizer), or
- a Hugging Face Hub id (``owner/name``), resolved from the local cache when offline.

The commands ``translate``, ``evaluate`` and ``plot-attention`` all go through
:func:`load_for_inference`, so they accept the same four forms.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from ..common.errors import UserError

logger = logging.getLogger(__name__)

# "owner/name" or "name": what huggingface_hub accepts as a repo id.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?$")


def looks_like_hub_id(text: str) -> bool:
    """``owner/name`` (or a bare ``name``) that is not an existing local path."""
    return bool(_HUB_ID.match(text)) and not Path(text).expanduser().exists()


@dataclass
class ModelLocation:
    """Where a model was found and what kind of folder it is."""

    model_path: str  # what from_pretrained receives: a local folder or a Hub id
    kind: str  # "training-run" | "export" | "model-folder" | "hub" | "ctranslate2" | "onnx" | "ensemble"
    run_dir: Path | None = None  # the training output folder, for kind == "training-run"


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    location: ModelLocation | None = None  # None: a model in memory (training's validation)
    info: dict = field(default_factory=dict)  # the run's metrics.json where there is one

    @property
    def family(self) -> str:
        return self.model.config.model_type


def locate_model(path_or_id: str | Path) -> ModelLocation:
    """Say what ``path_or_id`` is, without loading anything.

    A value that looks like a path and does not exist (it starts with ``.``, ``/`` or ``~``, has
    more than one ``/`` or a ``\\``, or its first part names a folder that exists here, as
    ``runs/nope`` where ``runs/`` exists) is a missing folder, never a Hub id.

    Raises :class:`UserError` for a path that does not exist or holds no model.
    """
    text = str(path_or_id)
    path = Path(text).expanduser()
    if path.is_dir():
        from .ct2 import is_ct2_folder

        from .onnx_folder import is_onnx_folder, looks_like_foreign_onnx

        if is_ct2_folder(path):
            return ModelLocation(str(path), "ctranslate2")
        if is_onnx_folder(path):
            return ModelLocation(str(path), "onnx")
        has_weights = any((path / name).is_file() for name in ("model.safetensors", "pytorch_model.bin"))
        if looks_like_foreign_onnx(path) and not has_weights and not (path / "model").is_dir():
            raise UserError(
                f"{path} holds .onnx files but no attention_seq2seq_onnx.json: it is not an export of "
                "`attention-seq2seq export --format onnx` (Optimum's and other tools' ONNX folders are not "
                "read here); export the training run with --format onnx"
            )
        if (path / "model" / "config.json").is_file():
            return ModelLocation(str(path / "model"), "training-run", run_dir=path)
        config_file = path / "config.json"
        if config_file.is_file():
            try:
                config = json.loads(config_file.read_text(encoding="utf-8"))
            except json.JSONDecodeError as err:
                raise UserError(f"{config_file} is not valid JSON: {err}") from None
            kind = "export" if "auto_map" in config else "model-folder"
            return ModelLocation(str(path), kind)
        raise UserError(
            f"{path} holds no model: expected a training output folder (with model/config.json), "
            "an export folder or a save_pretrained folder (with config.json)"
        )
    if path.exists():
        raise UserError(f"{path} is a file; give the model's folder or a Hub id")
    looks_local = text.startswith((".", "/", "~")) or text.count("/") > 1 or "\\" in text
    if looks_local or not _HUB_ID.match(text):
        raise UserError(f"model folder not found: {path}")
    parent = text.split("/")[0]
    if "/" in text and Path(parent).is_dir():
        # "runs/nope" while ./runs exists: a mistyped folder, not the Hub repo "runs/nope" (which
        # would otherwise be looked up over the network, with retries, before failing).
        raise UserError(
            f"model folder not found: {path} (the folder {parent}/ exists here; for the Hub repo "
            f"{text!r}, run from another folder)"
        )
    return ModelLocation(text, "hub")


def pick_device(device: str | None = None) -> torch.device:
    """``device`` if given, else CUDA, else Apple MPS, else the CPU."""
    if device:
        try:
            chosen = torch.device(device)
        except RuntimeError:
            raise UserError(f"--device: unknown device {device!r}; use e.g. cpu, cuda, cuda:1, mps") from None
        if chosen.type == "cuda" and not torch.cuda.is_available():
            raise UserError(f"--device {device}: CUDA is not available on this machine; use cpu")
        if chosen.type == "mps" and not torch.backends.mps.is_available():
            raise UserError(f"--device {device}: Apple MPS is not available on this machine; use cpu")
        return chosen
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


# The model types of this package (modeling/registry.py): a failure to build one of them is a bug.
_OWN_MODEL_TYPES = ("rnn_seq2seq", "transformer_seq2seq")
# Tensors a model rebuilds (sinusoidal position tables) or starts at zero (Marian's
# final_logits_bias) where a checkpoint lacks them: not a sign of another model's weights.
_REBUILT_ON_LOAD = ("embed_positions.weight", "final_logits_bias")


class _HeldLoadReport(logging.Filter):
    """Holds back transformers' "LOAD REPORT" table while a model loads: where the weights do
    not fit, the one-line error says so instead; where they do, the table is logged after."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if "LOAD REPORT" in record.getMessage():
            self.held.append(record)
            return False
        return True


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def load_for_inference(
    path_or_id: str | Path,
    *,
    device: str | torch.device | None = None,
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
    revision: str | None = None,
) -> LoadedModel:
    """Load model and tokenizer from a training folder, an export folder, a model folder or a Hub id.

    With the package installed both families are registered with the Auto classes, so an export
    loads with the installed code; ``trust_remote_code=True`` runs the code shipped in the folder
    instead (what a user without this package gets). ``attn_implementation="eager"`` is needed to
    read Transformer attention weights.

    A CTranslate2 folder (``export --format ct2``) loads as a ``CT2Model`` (translation only:
    ``translate`` and ``translate_n_best`` accept it; it returns no logits or attention).
    """
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    location = locate_model(path_or_id)
    if location.kind == "ctranslate2":
        from .ct2 import load_ct2

        device_name = str(device) if device is not None else None
        model, tokenizer = load_ct2(location.model_path, device=device_name)
        return LoadedModel(model=model, tokenizer=tokenizer, location=location)
    if location.kind == "onnx":
        from .onnx_backend import load_onnx

        if device is not None and str(device) != "cpu":
            raise UserError(f"--device {device}: an ONNX export runs on the CPU here (onnxruntime's CPU provider)")
        model, tokenizer = load_onnx(location.model_path)
        return LoadedModel(model=model, tokenizer=tokenizer, location=location)
    _check_model_folder(location.model_path, path_or_id)
    target_device = device if isinstance(device, torch.device) else pick_device(device)
    kwargs = {"trust_remote_code": trust_remote_code}
    if revision is not None:
        kwargs["revision"] = revision
    try:
        tokenizer = AutoTokenizer.from_pretrained(location.model_path, **kwargs)
    except OSError as err:  # offline Hub ids and half-written folders: the first line says which
        raise UserError(f"cannot load model {path_or_id}: {_first_line(err)}") from None
    except Exception as err:  # tokenizer.json cut short or damaged, a tokenizer of a kind not read here
        raise UserError(
            f"cannot load model {path_or_id}: its tokenizer files (tokenizer.json, tokenizer_config.json) do not "
            f"load ({type(err).__name__}: {_first_line(err)}); they are damaged, or of a kind this installation "
            "cannot read: copy or export the folder again"
        ) from None
    model_kwargs = dict(kwargs)
    if attn_implementation is not None:
        model_kwargs["attn_implementation"] = attn_implementation
    report = _HeldLoadReport()  # transformers' table of missing keys: this function says it in one line
    transformers_logger = logging.getLogger("transformers.modeling_utils")
    transformers_logger.addFilter(report)
    try:
        model, loading_info = AutoModelForSeq2SeqLM.from_pretrained(
            location.model_path, output_loading_info=True, **model_kwargs
        )
    except OSError as err:
        raise UserError(f"cannot load model {path_or_id}: {_first_line(err)}") from None
    except Exception as err:  # a cut or damaged weights file, a config of another kind of model
        first_line = _first_line(err)
        if type(err).__name__ == "SafetensorError":
            raise UserError(
                f"cannot load model {path_or_id}: its model.safetensors is damaged or cut short ({first_line}); "
                "copy or export the folder again"
            ) from None
        if isinstance(err, RuntimeError) and "ignore_mismatched_sizes" in str(err):
            raise UserError(
                f"cannot load model {path_or_id}: the tensors of its model.safetensors do not have the shapes its "
                "config.json describes; the two files belong to different models"
            ) from None
        kind = getattr(model_config_of(location.model_path), "model_type", None)
        if isinstance(err, ValueError) and "Unrecognized configuration class" in first_line:
            raise UserError(
                f"cannot load model {path_or_id}: its config.json is a {kind or 'another'!r} model, not an "
                "encoder-decoder; give a folder of this package's models (or another seq2seq model)"
            ) from None
        if kind is not None and kind not in _OWN_MODEL_TYPES:  # another library's model that does not build
            raise UserError(
                f"cannot load model {path_or_id}: the {kind!r} model its config.json describes does not build "
                f"({type(err).__name__}: {first_line}); its config.json does not belong with its weights: "
                "copy or export the folder again"
            ) from None
        raise  # one of this package's models failing to build: a bug, with its traceback
    finally:
        transformers_logger.removeFilter(report)
    missing = [name for name in sorted(loading_info.get("missing_keys") or ()) if not name.endswith(_REBUILT_ON_LOAD)]
    if missing:  # transformers would start these tensors at random and translate garbage
        raise UserError(
            f"cannot load model {path_or_id}: its model.safetensors lacks {len(missing)} of the tensors its "
            f"config.json (a {model.config.model_type!r} model) needs (first: {missing[0]}); the weights and "
            "config.json belong to different models: copy or export the folder again"
        )
    for record in report.held:  # unused tensors only (the model is whole): transformers' report, as it writes it
        transformers_logger.handle(record)
    vocab_size = getattr(model.config, "vocab_size", None)
    if vocab_size is not None and len(tokenizer) > vocab_size:
        raise UserError(
            f"cannot load model {path_or_id}: its tokenizer has {len(tokenizer)} tokens but the model's embeddings "
            f"have {vocab_size} rows (config.json vocab_size); the tokenizer files belong to another model"
        )
    model.to(target_device)
    model.eval()

    info: dict = {}
    if location.run_dir is not None and (location.run_dir / "metrics.json").is_file():
        info = json.loads((location.run_dir / "metrics.json").read_text(encoding="utf-8"))
    return LoadedModel(model=model, tokenizer=tokenizer, location=location, info=info)


# What generation_config.json's decoding fields may hold (transformers loads any value and fails,
# or decodes oddly, only at generate): {field: (kind, lowest, what is valid)}.
_GENERATION_FIELDS = {
    "num_beams": ("int", 1, "a whole number >= 1"),
    "num_return_sequences": ("int", 1, "a whole number >= 1"),
    "max_new_tokens": ("int", 1, "a whole number >= 1, or null"),
    "max_length": ("int", 1, "a whole number >= 1, or null"),
    "min_length": ("int", 0, "a whole number >= 0"),
    "min_new_tokens": ("int", 0, "a whole number >= 0, or null"),
    "no_repeat_ngram_size": ("int", 0, "a whole number >= 0"),
    "top_k": ("int", 0, "a whole number >= 0"),
    "length_penalty": ("float", None, "a finite number"),
    "repetition_penalty": ("float", 0.0, "a finite number > 0"),
    "temperature": ("float", 0.0, "a finite number > 0"),
    "top_p": ("float", 0.0, "a number in (0, 1]"),
}
_TOKEN_ID_FIELDS = ("decoder_start_token_id", "bos_token_id", "eos_token_id", "pad_token_id")


def generation_config_fault(values: dict, vocab_size: int | None) -> str | None:
    """What is wrong with the decoding values of a ``generation_config.json`` (as parsed JSON), in
    a few words naming the field and what would be valid; None when nothing is.

    Token ids (``decoder_start_token_id``, ``bos``/``eos``/``pad_token_id``; ``eos`` may be a list)
    must lie in ``[0, vocab_size)``. ``null`` is valid for every field (transformers' default).
    """
    import math

    for name, (kind, lowest, valid) in _GENERATION_FIELDS.items():
        value = values.get(name)
        if value is None:
            continue
        number = not isinstance(value, bool) and isinstance(value, (int, float) if kind == "float" else int)
        if not number or (kind == "float" and not math.isfinite(value)):
            return f"field {name} is {json.dumps(value)}; valid: {valid}"
        if lowest is not None and (value < lowest if kind == "int" else value <= lowest):
            return f"field {name} is {json.dumps(value)}; valid: {valid}"
        if name == "top_p" and value > 1:
            return f"field {name} is {json.dumps(value)}; valid: {valid}"
    valid = f"a token id in [0, {vocab_size}) (config.json vocab_size)" if vocab_size else "a token id >= 0"
    for name in _TOKEN_ID_FIELDS:
        value = values.get(name)
        if value is None:
            continue
        ids = value if isinstance(value, list) and name == "eos_token_id" else [value]
        for token in ids:
            if (
                isinstance(token, bool)
                or not isinstance(token, int)
                or token < 0
                or (vocab_size and token >= vocab_size)
            ):
                return f"field {name} is {json.dumps(value)}; valid: {valid}"
    return None


def _check_model_folder(model_path, path_or_id) -> None:
    """The faults of a local model folder that transformers passes over quietly, as one line each.

    - ``generation_config.json`` that does not load: transformers warns and decodes with the
      defaults (another beam size, length, penalty: other translations, silently); or that loads
      but holds a value generate fails on later, after an output was opened
      (:func:`generation_config_fault`: num_beams 0, a token id outside the vocabulary).
    - ``config.json`` naming one family's ``model_type`` over the other family's architecture
      (a hand-edited or mixed-up folder): the model does not build, with a message about sizes.
    - ``tokenizer.json`` missing where ``tokenizer_config.json`` is there: said as missing, not
      as damaged.

    Raises:
        UserError: naming the file and what would be valid. A Hub id or a folder without the file
            passes.
    """
    folder = Path(model_path)
    if not folder.is_dir():
        return
    try:
        raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raw = None  # no config.json or a damaged one: from_pretrained says which
    generation_file = folder / "generation_config.json"
    if generation_file.is_file():
        from transformers import GenerationConfig

        fix = (
            "it holds the decoding defaults (num_beams, max_new_tokens, length_penalty): fix it, or delete it to "
            "decode with transformers' defaults"
        )
        try:
            GenerationConfig.from_pretrained(folder)
            values = json.loads(generation_file.read_text(encoding="utf-8"))
        except Exception as err:  # noqa: BLE001 - JSON syntax, a value GenerationConfig refuses
            raise UserError(
                f"cannot load model {path_or_id}: its generation_config.json does not load ({_first_line(err)}); {fix}"
            ) from None
        vocab_size = raw.get("vocab_size") if isinstance(raw, dict) else None
        fault = generation_config_fault(values, vocab_size if isinstance(vocab_size, int) else None)
        if fault is not None:
            raise UserError(f"cannot load model {path_or_id}: its generation_config.json {fault}; {fix}")
    if isinstance(raw, dict) and raw.get("model_type") in _OWN_MODEL_TYPES:
        from ..modeling.registry import BY_MODEL_TYPE

        named = BY_MODEL_TYPE[raw["model_type"]]
        for architecture in raw.get("architectures") or ():
            other = next((f for f in BY_MODEL_TYPE.values() if f.lm_class == architecture and f is not named), None)
            if other is not None:
                raise UserError(
                    f"cannot load model {path_or_id}: its config.json says model_type {raw['model_type']!r} (the "
                    f"{named.name} family) but architectures {architecture!r} (the {other.name} family, model_type "
                    f"{other.model_type!r}); the file was edited or mixed up: copy or export the folder again"
                )
    vocabulary_files = ("tokenizer.json", "source.spm", "spiece.model", "vocab.json", "vocab.txt")
    if (folder / "tokenizer_config.json").is_file() and not any((folder / n).is_file() for n in vocabulary_files):
        raise UserError(
            f"cannot load model {path_or_id}: its tokenizer.json is missing (tokenizer_config.json is there); "
            "copy or export the folder again"
        )


def model_config_of(path):
    """The transformers config of a model folder or id, or None where it cannot be read."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path)
    except Exception:  # noqa: BLE001 - only for naming the model type in an error
        return None


def load_ensemble(
    paths_or_ids: Sequence[str | Path],
    *,
    weights: Sequence[float] | None = None,
    device: str | torch.device | None = None,
    trust_remote_code: bool = False,
    revision: str | None = None,
) -> LoadedModel:
    """Load several models as one :class:`~attention_seq2seq.translation.ensemble.EnsembleForConditionalGeneration`
    (``translate -m A -m B``): each step decodes with the weighted mean of the members'
    log-probabilities.

    Members load as :func:`load_for_inference` loads one model (any of its four forms, either
    family); the tokenizer is the first member's, and every member must have the same one.

    Args:
        paths_or_ids: two or more models.
        weights: one non-negative weight per member (normalised to sum 1); None: equal weights.
        device, trust_remote_code, revision: as :func:`load_for_inference`, for every member.

    Returns:
        LoadedModel with ``location.kind == "ensemble"`` and no ``run_dir`` (an ensemble's scores
        belong to no single training run, so nothing is written into a member's folder).

    Raises:
        UserError: a member that does not load (naming it), a CTranslate2 member, members with
            different vocabularies or tokenizers (one line naming both), or weights that do not fit.
    """
    from .ensemble import EnsembleForConditionalGeneration

    names = [str(p) for p in paths_or_ids]
    if len(names) < 2:
        raise UserError(f"an ensemble needs at least two models (-m A -m B); got {len(names)}")
    if weights is not None and len(weights) != len(names):
        raise UserError(f"--ensemble-weights gives {len(weights)} weight(s) for {len(names)} models; give one per -m")
    target_device = device if isinstance(device, torch.device) else pick_device(device)
    members: list[LoadedModel] = []
    for number, name in enumerate(names, start=1):
        try:
            from .engine import RUNTIME_NAMES

            kind = locate_model(name).kind
            if kind in RUNTIME_NAMES:
                raise UserError(
                    f"it is {RUNTIME_NAMES[kind]}; an ensemble decodes with PyTorch models (give the "
                    "training run or a --format remote/native export)"
                )
            members.append(
                load_for_inference(name, device=target_device, trust_remote_code=trust_remote_code, revision=revision)
            )
        except UserError as error:
            raise UserError(f"ensemble member {number} (-m {name}): {error}") from None
    first_vocab = members[0].tokenizer.get_vocab()
    for name, member in zip(names[1:], members[1:]):
        if member.tokenizer.get_vocab() != first_vocab:
            raise UserError(
                f"ensemble members must share one tokenizer: {names[0]} and {name} have different "
                f"vocabularies ({len(first_vocab)} and {len(member.tokenizer.get_vocab())} tokens)"
            )
    try:
        ensemble = EnsembleForConditionalGeneration([m.model for m in members], weights=weights, names=names)
    except ValueError as error:
        raise UserError(str(error)) from None
    ensemble.to(target_device)
    ensemble.eval()
    return LoadedModel(
        model=ensemble,
        tokenizer=members[0].tokenizer,
        location=ModelLocation(" + ".join(names), "ensemble"),
    )


def generation_kwargs(
    *,
    num_beams: int | None = None,
    greedy: bool = False,
    do_sample: bool = False,
    top_k: int | None = None,
    top_p: float | None = None,
    temperature: float | None = None,
    max_new_tokens: int | None = None,
    length_penalty: float | None = None,
) -> dict:
    """Translate the command-line decoding options into ``generate`` keyword arguments.

    Options left at ``None`` are not passed, so the model's own ``generation_config`` decides.
    ``length_penalty`` is transformers' beam-search exponent α: a finished hypothesis scores
    log p(y | x) / |y|^α (default α = 1, the per-token mean; α = 0 no normalisation; a larger α
    favours longer translations, a negative one shorter; Wu et al. 2016, §7, use a related one).
    """
    kwargs: dict = {}
    if greedy:
        kwargs.update(num_beams=1, do_sample=False)
    elif do_sample:
        kwargs.update(do_sample=True, num_beams=num_beams or 1)
    elif num_beams is not None:
        kwargs["num_beams"] = num_beams
    for name, value in (("top_k", top_k), ("top_p", top_p), ("temperature", temperature)):
        if value is not None:
            kwargs[name] = value
    if max_new_tokens is not None:
        kwargs["max_new_tokens"] = max_new_tokens
    if length_penalty is not None:
        kwargs["length_penalty"] = length_penalty
    return kwargs


def translate(loaded: LoadedModel, sentences: Sequence[str], **options) -> list[str]:
    """The best translation of each sentence, in input order ("" for an empty one): the first
    hypothesis of :func:`translate_n_best`, which takes the same ``options`` (batching, truncation,
    progress, a group's shard, ``generate`` kwargs)."""
    return [hypotheses[0][0] for hypotheses in translate_n_best(loaded, sentences, scores=False, **options)]


@torch.inference_mode()
def translate_n_best(
    loaded: LoadedModel,
    sentences: Sequence[str],
    *,
    batch_size: int = 32,
    max_batch_tokens: int | None = None,
    max_source_length: int | None = None,
    progress: bool = False,
    scores: bool = True,
    rank: int = 0,
    world_size: int = 1,
    **generate_kwargs,
) -> list[list[tuple[str, float | None]]]:
    """Per sentence, ``num_return_sequences`` (default 1) translations with their scores, best first.

    One call of the engine (`translation.engine.Translator`, which the ``translate`` command uses
    too): sentences sorted by length in tokens, batches of at most ``batch_size`` sentences (None:
    no cap) and, with ``max_batch_tokens``, at most that many padded source tokens; a sentence
    longer than ``max_source_length`` (default: the model's limit) is cut keeping its ``</s>``.
    A CTranslate2 or ONNX folder translates through its own runtime.

    The score is the one search ranks by: log p(y | x) / |y|^length_penalty (beam search's
    ``sequences_scores``; CTranslate2's own score for a CTranslate2 folder); None for greedy
    search and sampling, and for every hypothesis with ``scores=False`` (which spares
    ``generate`` keeping each step's scores). Empty lines give [("", None)] * n.

    ``world_size`` > 1: each process of an Accelerate group (``rank`` its index) decodes its share
    of the batches and every process returns the whole list, the one a single process returns.
    """
    from tqdm.auto import tqdm

    from .engine import RunStats, TranslationOptions, Translator, is_ct2, is_onnx

    kwargs = dict(generate_kwargs)
    n = kwargs.pop("num_return_sequences", 1) or 1
    beams = kwargs.get("num_beams") or loaded.model.generation_config.num_beams or 1
    own_search = is_ct2(loaded.model) or is_onnx(loaded.model)  # runtimes that score every hypothesis
    with_scores = scores and (own_search or (beams > 1 and not kwargs.get("do_sample", False)))
    options = TranslationOptions(batch_size, max_batch_tokens, max_source_length, n_best=n, scores=with_scores)
    translator = Translator(loaded, options, kwargs)
    non_empty = sum(1 for s in sentences if s.strip())
    stats = RunStats()
    with tqdm(total=non_empty, unit="sent", disable=not progress, dynamic_ncols=True) as bar:
        found = translator.translate(sentences, stats=stats, progress=bar.update, shard=(rank, world_size))
    if world_size > 1:
        from accelerate.utils import gather_object

        for k, hypotheses in gather_object([(k, h) for k, h in enumerate(found) if h is not None]):
            found[k] = hypotheses
    if stats.truncated and rank == 0:
        logger.warning(
            "%d sentence(s) longer than %s tokens were truncated (first: sentence %d); "
            "max_source_length sets the limit",
            stats.truncated,
            translator.limit,
            stats.first_truncated,
        )
    return [
        [(h.text, h.score if sentence.strip() else None) for h in hypotheses]  # the engine scores "" 0.0
        for sentence, hypotheses in zip(sentences, found)
    ]
