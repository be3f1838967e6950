"""Checkpoint averaging: the element-wise mean of the weights of k checkpoints.

Averaging the last few checkpoints of a run (Vaswani et al. 2017, section 6.1: "the last 5
checkpoints") or the best few on validation smooths out the noise of the final updates and
usually gains a fraction of a BLEU point for free. fairseq (``average_checkpoints.py``),
OpenNMT-py (``average_models.py``) and Marian (``--average``) ship it; transformers does not.

A checkpoint is a folder written by ``accelerator.save_state`` or ``save_pretrained`` (its
``model.safetensors`` is read, or, for a folder saved with ``max_shard_size``, every shard named by
its ``model.safetensors.index.json``, as ``from_pretrained`` reads them), or a ``.safetensors`` file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import json

import torch
from safetensors.torch import load_file, save_file

from .file_modes import give_ordinary_modes

WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"  # a sharded save_pretrained folder


def checkpoint_weights_file(path: str | Path) -> Path:
    """The weights file of a checkpoint: its ``model.safetensors``, else its sharded index
    ``model.safetensors.index.json``, or ``path`` itself if it is a file.

    Raises:
        FileNotFoundError: no weights file there.
    """
    path = Path(path)
    if not path.is_dir():
        if not path.is_file():
            raise FileNotFoundError(f"checkpoint not found: {path}")
        return path
    for name in (WEIGHTS_FILE, WEIGHTS_INDEX_FILE):
        if (path / name).is_file():
            return path / name
    raise FileNotFoundError(f"no {WEIGHTS_FILE} (or sharded {WEIGHTS_INDEX_FILE}) in checkpoint {path}")


def load_checkpoint_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint (see :func:`checkpoint_weights_file`), shards joined.

    Raises:
        FileNotFoundError: no weights file, or a shard the index names is missing.
        ValueError: the index is not JSON with a ``weight_map``.
    """
    file = checkpoint_weights_file(path)
    if file.name != WEIGHTS_INDEX_FILE:
        return load_file(str(file))
    try:
        weight_map = json.loads(file.read_text(encoding="utf-8"))["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{file}: not a safetensors index with a weight_map ({err})") from None
    weights: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        shard_file = file.parent / shard
        if not shard_file.is_file():
            raise FileNotFoundError(f"{file} names the shard {shard}, which is not in {file.parent}")
        weights.update(load_file(str(shard_file)))
    missing = sorted(set(weight_map) - set(weights))
    if missing:
        raise ValueError(f"{file}: its shards lack {len(missing)} tensor(s) it lists, e.g. {missing[:3]}")
    return weights


def average_state_dicts(state_dicts: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Element-wise mean of floating-point tensors; other tensors (int buffers) from the last one.

    The sum is taken in float64 and cast back to each tensor's dtype, so averaging k copies of
    the same weights returns exactly those weights.

    Raises:
        ValueError: no state dicts, or they do not have the same keys and shapes.
    """
    if not state_dicts:
        raise ValueError("need at least one checkpoint to average")
    keys = list(state_dicts[0].keys())
    for i, sd in enumerate(state_dicts[1:], start=1):
        if set(sd.keys()) != set(keys):
            missing = sorted(set(keys) ^ set(sd.keys()))[:5]
            raise ValueError(f"checkpoint {i} has different parameters than checkpoint 0 (e.g. {missing})")
    averaged = {}
    for key in keys:
        tensors = [sd[key] for sd in state_dicts]
        if any(t.shape != tensors[0].shape for t in tensors):
            raise ValueError(f"parameter {key!r} has different shapes across checkpoints")
        if tensors[0].is_floating_point():
            total = torch.zeros(tensors[0].shape, dtype=torch.float64)
            for t in tensors:
                total += t.to(torch.float64)
            averaged[key] = (total / len(tensors)).to(tensors[0].dtype)
        else:
            averaged[key] = tensors[-1].clone()
    return averaged


def average_checkpoints(paths: Sequence[str | Path]) -> dict[str, torch.Tensor]:
    """Average the weights stored in ``paths`` (checkpoint folders, sharded or not, or safetensors files)."""
    return average_state_dicts([load_checkpoint_weights(p) for p in paths])


def load_averaged_weights(model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Load averaged weights into ``model``, tolerating only tied parameters that were not stored.

    safetensors files store a tied tensor once, so e.g. ``lm_head.weight`` may be absent when it
    is tied to the embeddings; those are restored by ``model.tie_weights()``.

    Raises:
        RuntimeError: a parameter is missing that is not one of the model's tied copies, or the
            state dict has a key the model does not know.
    """
    result = model.load_state_dict(dict(state_dict), strict=False)
    if result.unexpected_keys:
        raise RuntimeError(f"averaged weights have unknown parameters: {result.unexpected_keys[:5]}")
    if result.missing_keys:
        # A missing key is fine only if it shares storage with a loaded parameter (a tied weight).
        loaded_ptrs = {p.data_ptr() for n, p in model.state_dict().items() if n in state_dict}
        tie = getattr(model, "tie_weights", None)
        if tie is not None:
            tie()
        untied = [k for k in result.missing_keys if model.state_dict()[k].data_ptr() not in loaded_ptrs]
        if untied:
            raise RuntimeError(f"averaged weights lack parameters: {untied[:5]}")


def save_averaged(paths: Sequence[str | Path], output_file: str | Path) -> Path:
    """Average ``paths`` and write the result as a safetensors file; returns its path."""
    output_file = Path(output_file)
    output_file.parent.mkdir(parents=True, exist_ok=True)
    save_file(average_checkpoints(paths), str(output_file), metadata={"format": "pt"})
    give_ordinary_modes(output_file)  # safetensors writes 0600
    return output_file


def newest_checkpoints(run: Path, last: int) -> list[Path]:
    """The ``last`` newest ``<run>/checkpoints/step_<N>`` folders, oldest first.

    Raises:
        UserError: ``run`` is not a folder, has no checkpoints, or fewer than ``last``.
    """
    from ..common.errors import UserError
    from .checkpoints import step_dirs

    if not run.is_dir():
        raise UserError(f"--run: folder not found: {run}")
    steps = step_dirs(run / "checkpoints")
    if not steps:
        raise UserError(f"--run: no checkpoints/step_<N> folders in {run}")
    if len(steps) < last:
        raise UserError(f"--last {last}: {run} has only {len(steps)} checkpoints")
    return steps[-last:]


def write_averaged_model(
    checkpoints: Sequence[Path], config_from: str, output: Path, *, trust_remote_code: bool = False
) -> list[str]:
    """Average ``checkpoints`` into a complete model folder ``output``: the model of
    ``config_from`` (a model folder) with the averaged weights, its generation config and
    tokenizer. Returns notes for the user (e.g. no tokenizer to copy).

    Raises:
        UserError: ``config_from`` is no local model folder, a checkpoint has no weights, or the
            weights do not fit the model.
    """
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, GenerationConfig

    from ..common.errors import UserError
    from ..translation.loading import locate_model

    location = locate_model(config_from)
    if location.kind == "hub":
        raise UserError(f"--config-from: folder not found: {config_from}")
    try:
        averaged = average_checkpoints(checkpoints)
    except (FileNotFoundError, ValueError) as err:
        raise UserError(str(err)) from None
    model = AutoModelForSeq2SeqLM.from_pretrained(location.model_path, trust_remote_code=trust_remote_code)
    try:
        load_averaged_weights(model, averaged)
    except RuntimeError as err:
        raise UserError(f"checkpoints do not fit the model of --config-from {config_from}: {err}") from None
    model.save_pretrained(output)
    notes = []
    try:
        GenerationConfig.from_pretrained(location.model_path).save_pretrained(output)
    except OSError:
        pass  # no generation_config.json there: save_pretrained wrote the model's own
    try:
        AutoTokenizer.from_pretrained(location.model_path).save_pretrained(output)
    except (OSError, ValueError):
        notes.append(f"no tokenizer in {location.model_path}; copy one into {output}")
    return notes
