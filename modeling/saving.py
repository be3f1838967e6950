"""`save_pretrained` of both model families: shareable folders and file modes.

transformers' sharing route for custom models (`register_for_auto_class()`, then
`save_pretrained()` / `push_to_hub()`, or `Seq2SeqTrainer.push_to_hub()`) copies the file that
defines the model class and the files it imports relatively. The installed package's modeling
files import `..configuration.<module>` from another folder, which that copy cannot follow
(FileNotFoundError). When the package is installed it sets `REMOTE_CODE_WRITER` (see
`attention_seq2seq/__init__.py`), and a registered model's `save_pretrained` writes what
`attention-seq2seq export` ships instead: the flattened code, `auto_map` and the pipeline, so the
folder loads with `trust_remote_code=True` where the package is not installed. In a shipped copy
(already flat) the hook is unset and transformers copies the flat files itself.

safetensors writes its files with mode 0600; the weights get the mode of the `config.json` written
next to them (0644 under the usual umask), like every other file of the folder.

Shipped to the Hub next to the modeling files (a flat sibling); imports the standard library only.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

# (model, save_directory) -> None: writes the flattened remote code and auto_map into a folder that
# save_pretrained has just written. Set by the installed package; None in a shipped copy.
REMOTE_CODE_WRITER: Callable | None = None


class Seq2SeqSavingMixin:
    """Put before `PreTrainedModel` in the bases of a model family's base class."""

    def save_pretrained(self, save_directory, *args, **kwargs):
        """`PreTrainedModel.save_pretrained`, plus: weights files get `config.json`'s mode, and a
        class registered with `register_for_auto_class()` writes a self-contained remote-code folder
        (flattened code, `auto_map`, `custom_pipelines`) when the package is installed.

        Raises:
            ValueError: `push_to_hub=True` together with `register_for_auto_class()` on the installed
                package (use `model.push_to_hub(repo_id)`, which saves through this method first, or
                `attention-seq2seq export` then `attention-seq2seq push`).
        """
        writer = REMOTE_CODE_WRITER
        cls = type(self)
        if writer is None or getattr(cls, "_auto_class", None) is None:
            result = super().save_pretrained(save_directory, *args, **kwargs)
        else:
            if kwargs.get("push_to_hub"):
                raise ValueError(
                    "save_pretrained(push_to_hub=True) after register_for_auto_class() would upload the folder "
                    "before its remote code is written; call model.push_to_hub(repo_id), or write a Hub folder "
                    "with `attention-seq2seq export` and upload it with `attention-seq2seq push`"
                )
            # transformers would copy this file and follow its `..configuration` import out of the
            # folder; the writer ships the flattened files instead.
            registered = cls.__dict__.get("_auto_class")
            cls._auto_class = None
            try:
                result = super().save_pretrained(save_directory, *args, **kwargs)
            finally:
                if registered is None:
                    del cls._auto_class
                else:
                    cls._auto_class = registered
            writer(self, save_directory)
        _give_weights_the_config_mode(Path(save_directory))
        return result


def _give_weights_the_config_mode(folder: Path) -> None:
    config_file = folder / "config.json"
    if not config_file.is_file():
        return
    mode = config_file.stat().st_mode & 0o777
    for weights in folder.glob("*.safetensors"):
        if weights.stat().st_mode & 0o777 != mode:
            os.chmod(weights, mode)


__all__ = ["REMOTE_CODE_WRITER", "Seq2SeqSavingMixin"]
