"""Turn a trained model into a self-contained Hub folder that needs only transformers to run.

``export_model(src, export_dir)`` writes::

    export_dir/
      config.json                  with auto_map (AutoConfig, AutoModel, AutoModelForSeq2SeqLM) and
                                   custom_pipelines ("translation", "text2text-generation")
      generation_config.json
      model.safetensors
      tokenizer.json, tokenizer_config.json, ...
      configuration_<family>.py    the package's code, shipped flat (hub/shipped_code.py): the
      modeling_<family>.py         family's modules, the pipeline and the package modules they
      pipeline_translation.py      import, each under its own name
      custom_generate/generate.py  lexically constrained beam search (translation/constraints.py) in
      custom_generate/requirements.txt  transformers' custom_generate convention: loaded with
                                   trust_remote_code=True, ``generate(..., constraints=[...])`` works
      README.md                    the model card (``attention_seq2seq.hub.model_card``)
      attention_heatmap.png        the card's image, when the source has one
      metrics.json, recipe.yaml    copied from the source, when it has them (published as they are:
                                   check them for local paths you would rather not share)
      app.py, space.json,          with ``space=True``: the attention explorer as a Gradio app
      explorer_app.py, ...,        (hub/space.py)
      requirements.txt

The export is deterministic (same input, byte-identical files) and written to a temporary folder
that replaces ``export_dir`` only once complete, so a failed export leaves nothing behind and an
existing export is only replaced with ``overwrite=True``.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from ..modeling.registry import BY_MODEL_TYPE, ModelFamily
from ..common.durability import write_atomically
from .model_card import ModelCardError, code_checksums, render_model_card
from .shipped_code import ExportError, shipped_files, write_files


# model_type -> where the family's shipped code lives and what ``auto_map`` names (modeling/registry.py)
FAMILIES = BY_MODEL_TYPE

PIPELINE_MODULE = "pipeline_translation"
PIPELINE_CLASS = "Seq2SeqTranslationPipeline"
PIPELINE_TASKS = ("translation", "text2text-generation")
HEATMAP_NAME = "attention_heatmap.png"
# Constrained beam search, shipped as custom_generate/generate.py (transformers' convention).
CONSTRAINTS_MODULE = "attention_seq2seq.translation.constraints"
CUSTOM_GENERATE_REQUIREMENTS = ("torch>=2.6", "transformers>=5.24")


# ---------------------------------------------------------------------------- source folders


@dataclass(frozen=True)
class ExportSources:
    """The files an export is made from."""

    model_dir: Path
    metrics: Path | None
    recipe: Path | None
    heatmap: Path | None


def resolve_sources(
    src: str | os.PathLike,
    metrics: str | os.PathLike | None = None,
    recipe: str | os.PathLike | None = None,
    heatmap: str | os.PathLike | None = None,
) -> ExportSources:
    """Find the model folder, metrics, recipe and heat-map of ``src``.

    ``src`` is a training output folder (``model/``, ``metrics.json``, ``recipe.yaml``,
    ``plots/attention_test_0.png``; docs/DESIGN.md) or a plain ``save_pretrained`` folder, which
    may hold ``metrics.json``, ``recipe.yaml`` and ``attention_heatmap.png`` itself (as an export
    does). Explicit ``metrics`` / ``recipe`` / ``heatmap`` paths win over the ones found.

    Raises:
        ExportError: ``src`` holds no ``config.json`` (directly or in ``model/``; a LoRA run's
            folder with ``adapter/`` alone is named as such), or an explicit path does not exist.
    """
    src = Path(src)
    if (src / "model" / "config.json").is_file():
        model_dir, heatmap_found = src / "model", src / "plots" / "attention_test_0.png"
    elif (src / "config.json").is_file():
        model_dir, heatmap_found = src, src / HEATMAP_NAME
    elif (src / "adapter" / "adapter_config.json").is_file():
        raise ExportError(
            f"{src} is a LoRA run without a merged model: merge it first with "
            f"`attention-seq2seq finetune --merge-adapter {src}` (writes {src / 'model'})"
        )
    else:
        raise ExportError(
            f"{src} is neither a training output folder (model/config.json) nor a model folder (config.json)"
        )
    found = {"metrics": src / "metrics.json", "recipe": src / "recipe.yaml", "heatmap": heatmap_found}
    chosen = {}
    for name, explicit in (("metrics", metrics), ("recipe", recipe), ("heatmap", heatmap)):
        if explicit is not None:
            if not Path(explicit).is_file():
                raise ExportError(f"{name} file {explicit} does not exist")
            chosen[name] = Path(explicit)
        else:
            chosen[name] = found[name] if found[name].is_file() else None
    return ExportSources(model_dir=model_dir, **chosen)


# ---------------------------------------------------------------------------- shipped code


def collect_shipped_code(family: ModelFamily) -> dict[str, str]:
    """The remote code of ``family``: its configuration, modeling and pipeline modules and the
    package modules they import, flat (hub/shipped_code.py): ``{file name: text}``.

    Raises:
        ExportError: a file imports something that would not load where only transformers is
            installed, or imports a module that does not exist.
    """
    return shipped_files(
        [
            f"attention_seq2seq.configuration.{family.config_module}",
            f"attention_seq2seq.modeling.{family.modeling_module}",
            f"attention_seq2seq.modeling.{PIPELINE_MODULE}",
        ]
    )


def write_custom_generate(folder: str | os.PathLike) -> list[Path]:
    """Write ``custom_generate/generate.py`` (translation/constraints.py, shipped as it is) and
    ``custom_generate/requirements.txt`` into the model folder ``folder``, so that
    ``model.generate(custom_generate=folder, trust_remote_code=True, constraints=...)`` runs
    constrained beam search where this package is not installed.

    Note: ``from_pretrained(folder, trust_remote_code=True)`` then replaces the loaded model's
    ``generate`` by the shipped ``generate`` (plain ``generate`` when no ``constraints``).
    """
    files = shipped_files([CONSTRAINTS_MODULE])
    files["generate.py"] = files.pop("constraints.py")
    files["requirements.txt"] = "".join(line + "\n" for line in CUSTOM_GENERATE_REQUIREMENTS)
    return write_files(Path(folder) / "custom_generate", files)


def auto_map(family: ModelFamily) -> dict[str, str]:
    """The ``config.json`` ``auto_map``: Auto class name → ``<flat module>.<class>``."""
    return {
        "AutoConfig": f"{family.config_module}.{family.config_class}",
        "AutoModel": f"{family.modeling_module}.{family.base_model_class}",
        "AutoModelForSeq2SeqLM": f"{family.modeling_module}.{family.lm_class}",
    }


def custom_pipelines() -> dict[str, dict]:
    """The ``config.json`` ``custom_pipelines``: the shipped pipeline for each task it serves."""
    entry = {"impl": f"{PIPELINE_MODULE}.{PIPELINE_CLASS}", "pt": ["AutoModelForSeq2SeqLM"], "type": "text"}
    return {task: dict(entry) for task in PIPELINE_TASKS}


def write_remote_code(model, save_directory: str | os.PathLike) -> None:
    """Make a folder that ``model.save_pretrained`` has just written load with
    ``trust_remote_code=True`` where this package is not installed: the flattened code of the
    model's family, ``custom_generate/`` (constrained beam search, translation/constraints.py) and
    ``auto_map`` / ``custom_pipelines`` in its ``config.json`` (what ``export_model`` ships, without
    the card, metrics or recipe).

    Installed as ``modeling.saving.REMOTE_CODE_WRITER`` by the package, so that transformers'
    ``register_for_auto_class()`` + ``save_pretrained()`` / ``push_to_hub()`` route (and
    ``Seq2SeqTrainer.push_to_hub()`` of a registered model) works.

    Raises:
        ExportError: the model's ``model_type`` is not one of this package's families.
    """
    folder = Path(save_directory)
    model_type = getattr(model.config, "model_type", None)
    if model_type not in FAMILIES:
        raise ExportError(f"model_type {model_type!r} is not one of {', '.join(FAMILIES)}")
    family = FAMILIES[model_type]
    write_files(folder, collect_shipped_code(family))
    write_custom_generate(folder)
    config_file = folder / "config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config["auto_map"] = auto_map(family)
    config["custom_pipelines"] = custom_pipelines()
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------- PNG


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Ancillary chunks that carry text or a timestamp (matplotlib writes "Software"; others add dates).
_PNG_DROPPED_CHUNKS = {b"tEXt", b"zTXt", b"iTXt", b"tIME"}


def strip_png_metadata(data: bytes, name: str = "image") -> bytes:
    """Return the PNG ``data`` without text and time chunks, so the same pixels give the same bytes.

    Raises:
        ExportError: ``data`` is not a well-formed PNG.
    """
    if not data.startswith(_PNG_SIGNATURE):
        raise ExportError(f"{name} is not a PNG file (the card image must be a PNG)")
    out, position = [_PNG_SIGNATURE], len(_PNG_SIGNATURE)
    while position < len(data):
        if position + 8 > len(data):
            raise ExportError(f"{name} is a truncated PNG")
        (length,) = struct.unpack(">I", data[position : position + 4])
        kind = data[position + 4 : position + 8]
        end = position + 12 + length
        chunk = data[position:end]
        if end > len(data) or zlib.crc32(chunk[4:-4]) != struct.unpack(">I", chunk[-4:])[0]:
            raise ExportError(f"{name} is a corrupt PNG (chunk {kind!r})")
        if kind not in _PNG_DROPPED_CHUNKS:
            out.append(chunk)
        position = end
        if kind == b"IEND":
            break
    return b"".join(out)


# ---------------------------------------------------------------------------- export


def _read_config_json(model_dir: Path) -> dict:
    path = model_dir / "config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ExportError(f"cannot read {path}: {error}") from None


def family_of(model_dir: str | os.PathLike) -> ModelFamily:
    """The model family of a saved model folder, from its ``config.json`` ``model_type``.

    Raises:
        ExportError: the folder's model type is not one of this package's families.
    """
    model_type = _read_config_json(Path(model_dir)).get("model_type")
    if model_type not in FAMILIES:
        valid = " or ".join(repr(name) for name in FAMILIES)
        raise ExportError(f"{Path(model_dir) / 'config.json'} has model_type {model_type!r}; export supports {valid}")
    return FAMILIES[model_type]


def _check_destination(export_dir: Path, src: Path, overwrite: bool) -> None:
    source, target = src.resolve(), export_dir.resolve()
    if target == source or source in target.parents or target in source.parents:
        raise ExportError(f"export folder {export_dir} overlaps the source folder {src}; choose a separate folder")
    if target.exists() and not target.is_dir():
        raise ExportError(f"export folder {export_dir} exists and is not a folder")
    if target.is_dir() and any(target.iterdir()) and not overwrite:
        raise ExportError(f"export folder {export_dir} is not empty; pass overwrite=True (--overwrite) to replace it")


def _load_model_and_tokenizer(family: ModelFamily, model_dir: Path):
    import attention_seq2seq  # noqa: F401  (registers both families with the Auto classes)
    from transformers import AutoTokenizer

    modeling = importlib.import_module(f"attention_seq2seq.modeling.{family.modeling_module}")
    model = getattr(modeling, family.lm_class).from_pretrained(model_dir)
    try:
        # The package's own config class reads config.json; an export's auto_map is not needed here.
        tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
    except (OSError, ValueError) as error:
        raise ExportError(
            f"cannot load a tokenizer from {model_dir} ({error}); save the tokenizer next to the model "
            "(tokenizer.save_pretrained)"
        ) from None
    _reset_tokenizer_runtime_state(tokenizer)
    return model, tokenizer


# What transformers records in a loaded tokenizer's init_kwargs and would write back into
# tokenizer_config.json, though it describes how the tokenizer was loaded or last called, not the
# tokenizer: load arguments, and the per-call padding/truncation settings it copies from a
# tokenizer.json saved after a call with padding=True.
_TOKENIZER_RUNTIME_KWARGS = (
    "is_local", "local_files_only", "_commit_hash", "cache_dir", "revision", "token",
    "pad_token_type_id", "max_length", "pad_to_multiple_of", "stride", "truncation_strategy",
)  # fmt: skip


def _reset_tokenizer_runtime_state(tokenizer) -> None:
    """Drop what using or loading a tokenizer leaves in its saved files, so exports are byte-stable.

    A call with ``padding=True`` or ``truncation=True`` stores that strategy in the backend
    (``tokenizer.json``'s "padding"/"truncation"); transformers sets both again on every call.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        backend.no_padding()
        backend.no_truncation()
    for key in _TOKENIZER_RUNTIME_KWARGS:
        tokenizer.init_kwargs.pop(key, None)


def export_model(
    src: str | os.PathLike,
    export_dir: str | os.PathLike,
    *,
    metrics: str | os.PathLike | None = None,
    recipe: str | os.PathLike | None = None,
    heatmap: str | os.PathLike | None = None,
    repo_id: str | None = None,
    base_model: str | None = None,
    license: str | None = None,
    overwrite: bool = False,
    space: bool = False,
) -> Path:
    """Write a Hub-ready folder for the model in ``src``; returns ``export_dir``.

    Args:
        src: a training output folder or a ``save_pretrained`` model folder with tokenizer files
            (see ``resolve_sources``).
        export_dir: the folder to write; it must not exist or be empty unless ``overwrite``.
        metrics, recipe, heatmap: explicit metrics.json, recipe.yaml and PNG heat-map paths.
        repo_id: the Hub repository named in the card's usage snippets (default
            ``<your-username>/<export_dir name>``).
        base_model: the Hub id of the model this one was fine-tuned from (card metadata).
        license: the card's license id; default chosen from the training corpus's license.
        overwrite: replace a non-empty ``export_dir``; the old content is removed only once the
            new export is complete.
        space: also write the attention explorer's modules, ``app.py``, ``space.json`` (with
            ``repo_id`` as the Space's default model) and ``requirements.txt`` (hub/space.py).

    Raises:
        ExportError: bad source or destination, a model type this package does not export, shipped
            code with a disallowed import, a heat-map that is not a PNG, unreadable metrics or recipe,
            metrics the card cannot use (a test set without BLEU or chrF).
    """
    src, export_dir = Path(src), Path(export_dir)
    sources = resolve_sources(src, metrics, recipe, heatmap)
    _check_destination(export_dir, src, overwrite)
    family = family_of(sources.model_dir)
    shipped = collect_shipped_code(family)
    metrics_data = _read_mapping(sources.metrics, "metrics")
    recipe_data = _read_mapping(sources.recipe, "recipe")
    heatmap_bytes = strip_png_metadata(sources.heatmap.read_bytes(), str(sources.heatmap)) if sources.heatmap else None

    model, tokenizer = _load_model_and_tokenizer(family, sources.model_dir)
    model.config.auto_map = auto_map(family)
    model.config.custom_pipelines = custom_pipelines()

    card = _render_card(
        config=model.config,
        generation_config=model.generation_config,
        metrics=metrics_data,
        recipe=recipe_data,
        repo_id=repo_id or f"<your-username>/{export_dir.name}",
        heatmap=HEATMAP_NAME if heatmap_bytes is not None else None,
        base_model=base_model,
        license=license,
        num_parameters=sum(p.numel() for p in model.parameters()),
    )

    kept = "nothing was written in its place; an earlier export there is intact"

    def write(staging: Path) -> None:
        staging.mkdir()
        _write_export(staging, model, tokenizer, shipped, heatmap_bytes, sources, metrics_data, card, space, repo_id)
        # Last, so the checksums are those of the files as written (every .py, Space included).
        checksums = code_checksums(staging, repo_id or f"<your-username>/{export_dir.name}")
        (staging / "README.md").write_text(card.rstrip("\n") + "\n\n" + checksums + "\n", encoding="utf-8")

    write_atomically(export_dir, write, what="the export", kept=kept)
    return export_dir


def _write_export(staging, model, tokenizer, shipped, heatmap_bytes, sources, metrics_data, card, space, repo_id):
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    write_files(staging, shipped)
    # Terminology constraints travel with the model: transformers' custom_generate convention.
    write_custom_generate(staging)
    if heatmap_bytes is not None:
        (staging / HEATMAP_NAME).write_bytes(heatmap_bytes)
    if sources.metrics is not None:
        (staging / "metrics.json").write_text(
            json.dumps(metrics_data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )
    if sources.recipe is not None:
        shutil.copyfile(sources.recipe, staging / "recipe.yaml")
    if space:
        from .space import write_space

        write_space(staging, repo_id)


def _render_card(**kwargs) -> str:
    try:
        return render_model_card(**kwargs)
    except ModelCardError as error:
        raise ExportError(f"model card: {error}") from None


def _read_mapping(path: Path | None, what: str) -> dict | None:
    """The run's metrics.json (``what="metrics"``, JSON) or recipe.yaml (``"recipe"``, YAML) as a dict."""
    if path is None:
        return None
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if what == "metrics" else yaml.safe_load(text)
    except (OSError, json.JSONDecodeError, yaml.YAMLError) as error:
        raise ExportError(f"cannot read {what} file {path}: {error}") from None
    if not isinstance(data, dict):
        raise ExportError(f"{what} file {path} must hold a mapping (docs/DESIGN.md); got {type(data).__name__}")
    return data


def recorded_base_model(run: Path) -> str | None:
    """The Hub id a fine-tuned run recorded in its metrics.json as ``base_model``, if it is one.

    A local path there (a base that was never published) cannot go into the card's metadata.
    """
    from ..translation.loading import looks_like_hub_id

    metrics_file = run / "metrics.json"
    if not metrics_file.is_file():
        return None
    try:
        base = json.loads(metrics_file.read_text(encoding="utf-8")).get("base_model")
    except (json.JSONDecodeError, AttributeError):
        return None
    if isinstance(base, str) and base.count("/") == 1 and looks_like_hub_id(base):
        return base
    return None
