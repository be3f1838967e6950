"""Checkpoints of a training run: what is saved, how it is written, which ones are kept.

A checkpoint ``checkpoints/step_<N>/`` is Accelerate's ``save_state`` (model, optimizer, each
rank's RNG states, the grad scaler) plus :data:`STATE_FILE`, a dict of the loop's own state by
name (``{"trainer": TrainerState, "schedule": LearningRateSchedule}``'s ``state_dict()``).
Checkpoints written before that file existed kept the same objects in Accelerate's
``custom_checkpoint_<i>.pkl`` files, named by the order in which they were registered;
:func:`read_training_state` still reads those (:data:`LEGACY_CUSTOM_FILES`).

Every folder is written under a temporary name and renamed when complete
(:func:`atomic_write`), and deleted by renaming it away first (:func:`remove_dir`): a crash
at any moment (tests/test_resume_after_kill.py kills the process at each write) leaves only
complete checkpoints under ``step_<N>`` names, so resuming never starts from a partial one. ``best/``
keeps the weights of the best ``keep_best_k`` validations (:func:`update_best`).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..common.durability import tree_bytes, write_atomically
from .file_modes import give_ordinary_modes

STATE_FILE = "training_state.pt"

# Where checkpoints written before STATE_FILE keep each entry: accelerate's
# register_for_checkpointing(scheduler, plateau, trainer_state[, time_budget]) named them by position.
LEGACY_CUSTOM_FILES = {
    "custom_checkpoint_0.pkl": ("schedule", "lr_scheduler"),
    "custom_checkpoint_1.pkl": ("schedule", "plateau"),
    "custom_checkpoint_2.pkl": ("trainer", None),
    "custom_checkpoint_3.pkl": ("schedule", "time_budget"),  # linear_time runs only
}


@dataclass
class TrainerState:
    """Training state that is not in the model/optimizer/scheduler: saved with every checkpoint."""

    step: int = 0  # optimizer updates done
    epoch: int = 0  # epoch of the batch stream
    batch_in_epoch: int = 0  # micro-batches of that epoch this rank has consumed
    batches_per_epoch: int = 0  # micro-batches per epoch on one rank
    wall_time_s: float = 0.0  # time in the training loop, validation and checkpoints included (all sessions)
    train_time_s: float = 0.0  # time in optimizer updates only: the denominator of tokens/s
    target_tokens: int = 0  # non-padding target tokens trained on, all ranks together
    validation: list = field(default_factory=list)  # one dict per validation
    train_loss: list = field(default_factory=list)  # [step, mean smoothed loss per target token] per log
    best: list = field(default_factory=list)  # [[score, step], ...] of the weights kept in best/, best first
    bad_validations: int = 0  # validations since the last improvement (early stopping)

    def state_dict(self) -> dict:
        return dataclasses.asdict(self)

    def load_state_dict(self, state: dict) -> None:
        for key, value in state.items():
            setattr(self, key, value)

    @property
    def epochs(self) -> float:
        return self.epoch + self.batch_in_epoch / max(1, self.batches_per_epoch)


def step_dirs(root: Path) -> list[Path]:
    """``root/step_<N>`` folders, oldest first (temporary ``.tmp_*`` folders are ignored)."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := re.fullmatch(r"step_(\d+)", p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def remove_dir(folder: Path) -> None:
    """Delete ``folder`` so that no moment shows a half-deleted one under its name: it is renamed
    to ``.<name>.old`` first (which :func:`step_dirs` ignores; :func:`clear_leftovers` removes
    what a kill left), then removed."""
    if folder.exists():
        doomed = folder.with_name(f".{folder.name}.old")
        shutil.rmtree(doomed, ignore_errors=True)
        os.replace(folder, doomed)
        shutil.rmtree(doomed)


def atomic_write(accelerator, final: Path, write, kept: str | None = None) -> None:
    """Run ``write(tmp_dir)`` on every rank, then rename the folder to ``final`` on the main one
    (:func:`~attention_seq2seq.common.durability.write_atomically`): ``final`` is absent, the old
    complete folder or the new complete one at every moment, and the previous checkpoints stay
    intact. A full disk is one :class:`~attention_seq2seq.common.durability.DiskFullError` line
    naming the folder and the space it needs (the size of the newest sibling).
    """
    siblings = [p for p in step_dirs(final.parent) if p != final]
    if kept is None:
        kept = f"the previous {siblings[-1].parent.name}/{siblings[-1].name} is intact" if siblings else ""

    def write_all(tmp: Path) -> None:
        write(tmp)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            give_ordinary_modes(tmp)  # safetensors writes 0600

    write_atomically(
        final,
        write_all,
        needed=tree_bytes(siblings[-1]) if siblings else None,
        kept=kept,
        main=accelerator.is_main_process,
        barrier=accelerator.wait_for_everyone,
    )


def save_checkpoint(accelerator, root: Path, step: int, keep: int, states: dict | None = None) -> None:
    """Write ``root/step_<step>`` and delete all but the newest ``keep`` checkpoints.

    Args:
        states: name -> object with ``state_dict()``, saved together in :data:`STATE_FILE` by
            the main process (every rank reads them back on resume).
    """

    def write(tmp: Path) -> None:
        accelerator.save_state(str(tmp))
        if states and accelerator.is_main_process:
            torch.save({name: obj.state_dict() for name, obj in states.items()}, tmp / STATE_FILE)

    atomic_write(accelerator, root / f"step_{step}", write)
    if accelerator.is_main_process:
        prune_checkpoints(root, keep)


def prune_checkpoints(root: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints under ``root`` (main process only). Called
    after each save, and on resume: a run killed between a save and its pruning left one more."""
    for old in step_dirs(root)[:-keep]:
        remove_dir(old)
    clear_leftovers(root)


def clear_leftovers(root: Path) -> None:
    """Remove what a killed process left under ``root``: the hidden folders it was writing or
    deleting. Main process only, with the run's lock held, between writes."""
    for leftover in root.glob(".*") if root.is_dir() else []:
        shutil.rmtree(leftover, ignore_errors=True)


def read_training_state(folder: Path) -> dict:
    """The loop's state saved in checkpoint ``folder``: ``{"trainer": {...}, "schedule": {...}}``
    from :data:`STATE_FILE`, or assembled from the ``custom_checkpoint_<i>.pkl`` files of a
    checkpoint written before it (a ``linear_time`` clock only where one was saved).

    Raises:
        FileNotFoundError: ``folder`` holds neither (not a checkpoint of this trainer).
    """
    folder = Path(folder)
    if (folder / STATE_FILE).exists():
        return torch.load(folder / STATE_FILE, map_location="cpu", weights_only=True)
    if not (folder / "custom_checkpoint_2.pkl").exists():
        raise FileNotFoundError(
            f"{folder} is not a training checkpoint: it has neither {STATE_FILE} nor custom_checkpoint_2.pkl"
        )
    state: dict = {"schedule": {}}
    for name, (entry, key) in LEGACY_CUSTOM_FILES.items():
        if (folder / name).exists():
            # written by this trainer itself (accelerate's own load_custom_state reads them so)
            value = torch.load(folder / name, map_location="cpu", weights_only=False)
            if key is None:
                state[entry] = value
            else:
                state[entry][key] = value
    return state


def load_checkpoint(accelerator, folder: Path) -> dict:
    """Restore model, optimizer and RNG states from ``folder`` (``accelerator.load_state``) and
    return the loop's own state (:func:`read_training_state`).

    ``load_state`` refuses a folder whose ``custom_checkpoint_<i>.pkl`` files do not match the
    objects registered with the accelerator (none, here); a checkpoint written before
    :data:`STATE_FILE` is therefore loaded through a temporary folder of links to all its other files.
    """
    folder = Path(folder)
    legacy = [p for p in folder.iterdir() if re.fullmatch(r"custom_checkpoint_\d+\.pkl", p.name)]
    if not legacy:
        accelerator.load_state(str(folder))
        return read_training_state(folder)
    with tempfile.TemporaryDirectory(prefix="legacy_checkpoint_") as view:
        for path in folder.iterdir():
            if path not in legacy:
                os.symlink(path.resolve(), Path(view) / path.name)
        accelerator.load_state(view)
    return read_training_state(folder)


def update_best(
    accelerator, model, state: TrainerState, best_root: Path, score: float, higher_is_better: bool, k: int
) -> None:
    """Keep the weights of this validation in ``best/step_<N>`` if it is among the best ``k``."""
    if k < 1:
        return
    # Best score first; among equal scores the later (longer trained) weights win.
    ranked = sorted(state.best + [[score, state.step]], key=lambda e: (-e[0] if higher_is_better else e[0], -e[1]))
    kept, dropped = ranked[:k], ranked[k:]
    if [score, state.step] in kept:
        atomic_write(accelerator, best_root / f"step_{state.step}", lambda tmp: accelerator.save_model(model, str(tmp)))
    if accelerator.is_main_process:
        for _, step in dropped:
            remove_dir(best_root / f"step_{step}")
    state.best = kept


def drop_lost_best(best_root: Path, state: TrainerState) -> None:
    """After a resume: delete the ``best/`` folders the resumed checkpoint does not know (written
    after it, by the run's lost future)."""
    kept = {f"step_{s}" for _, s in state.best}
    for d in step_dirs(best_root):
        if d.name not in kept:
            remove_dir(d)
    clear_leftovers(best_root)


def final_weight_sources(
    state: TrainerState, ckpt_root: Path, best_root: Path, average_best_k: int, average_last_k: int, metric: str
) -> tuple[list[Path], str]:
    """The folders whose (mean) weights become the final model, and a description of the choice:
    the best ``average_best_k`` validations, the last ``average_last_k`` checkpoints, the best
    validation, or the last update."""
    if average_best_k:
        sources = [best_root / f"step_{s}" for _, s in state.best[:average_best_k]]
        return (
            sources,
            f"average of the best {len(sources)} validations (updates {[s for _, s in state.best[:average_best_k]]})",
        )
    if average_last_k:
        sources = step_dirs(ckpt_root)[-average_last_k:]
        return sources, f"average of the last {len(sources)} checkpoints ({[p.name for p in sources]})"
    if state.best:
        return [best_root / f"step_{state.best[0][1]}"], f"best validation {metric} (update {state.best[0][1]})"
    return [step_dirs(ckpt_root)[-1]], f"last update ({state.step})"
