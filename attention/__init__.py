"""Attention analysis: the teacher-forced attention pass, word alignments and the alignment error
rate, cross-attention heat-maps and their fonts, the attention explorer (Gradio) and the bertviz
adapter. Below ``translation/`` and ``training/``: it imports the models and data, never them."""
