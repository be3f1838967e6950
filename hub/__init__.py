"""Publishing to the Hugging Face Hub: export a trained model as a self-contained remote-code
folder with its model card (``export_model``), and upload it (``push_to_hub``)."""

from .export import ExportError, export_model
from .model_card import ModelCardError, render_model_card
from .push import PushError, PushResult, push_to_hub

__all__ = [
    "ExportError",
    "ModelCardError",
    "PushError",
    "PushResult",
    "export_model",
    "push_to_hub",
    "render_model_card",
]
