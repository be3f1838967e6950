"""Attention analysis: the teacher-forced attention pass, word alignments and the alignment error
rate, cross-attention heat-maps and their fonts, what the attention explorer shows and the bertviz
adapter (the Gradio app is attention_seq2seq/explorer_app.py). Below ``translation/`` and ``training/``: it
imports the models and data, never them."""
