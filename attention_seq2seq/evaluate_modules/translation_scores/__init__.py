"""The translation metric folder (``translation_scores.py`` and its card, ``README.md``).

``evaluate.load`` reads this folder as a metric script; the package imports
``translation_scores.translation_scores`` directly (translation/scores.py). This ``__init__.py`` only
makes the folder an installable package; it is not part of the metric Space.
"""
