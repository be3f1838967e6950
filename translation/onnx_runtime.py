"""Translate with an ``export --format onnx`` folder: greedy and beam search on onnxruntime.

Needs only numpy and onnxruntime (and ``tokenizers`` for the command line at the bottom); it
imports nothing from PyTorch or this package, so the export ships this very file
(``onnx_runtime.py``) and runs where PyTorch is not installed::

    python onnx_runtime.py FOLDER --num-beams 5 < input.txt > output.txt

Inside the package, ``translate -m FOLDER`` reaches it through translation/onnx_backend.py.

Decoding is transformers' ``generate`` re-done in numpy over the two graphs (hub/onnx_graphs.py):

- greedy: argmax of the logits at each step; a row stops at ``</s>`` or the length limit;
- beam search (``GenerationMixin._beam_search`` of transformers 5): each step keeps the best
  2·K of the K·V continuations by log p(y ≤ t | x); the best K that do not end are the next beams,
  and those ending in ``</s>`` among the top K become finished hypotheses scored
  log p / |y|^α (``length_penalty`` α, |y| the generated tokens, ``</s>`` included); a source
  stops when its best running beam can no longer beat its worst finished one (``early_stopping``
  False: judged at the current length; "never": at the longest allowed; True: once K finished).

Rows (greedy) and sources (beam) leave the batch as soon as they are final, so the graphs run
only on what is still open; what they compute for the others does not change (each row's
numbers depend on its own inputs only).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

MARKER_FILE = "attention_seq2seq_onnx.json"  # as translation/onnx_folder.py
NEG_INF = -1.0e9  # transformers' "impossible" beam score


@dataclass
class Hypothesis:
    """One output: generated token ids (``</s>`` included when it ended there), the total
    natural-log probability and the score search ranked it by (logprob / length^α)."""

    tokens: list
    logprob: float
    score: float


def top_k(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest entries of each row, largest first (ties: lower index first)."""
    k = min(k, values.shape[-1])
    part = np.argpartition(-values, k - 1, axis=-1)[..., :k]
    order = np.argsort(-np.take_along_axis(values, part, axis=-1), axis=-1, kind="stable")
    return np.take_along_axis(part, order, axis=-1)


class OnnxSeq2Seq:
    """An ONNX export folder, ready to decode token ids.

    Args:
        folder: the export folder.
        intra_threads: onnxruntime's threads inside one graph call (None: onnxruntime's default,
            one per core).
        providers: onnxruntime execution providers (default: CPU).

    Raises:
        ValueError: the folder is not an export of this package (naming the file), or a graph
            does not load.
    """

    def __init__(self, folder, *, intra_threads: int | None = None, providers: Sequence[str] | None = None):
        import onnxruntime

        self.folder = Path(folder)
        marker = self.folder / MARKER_FILE
        try:
            spec = json.loads(marker.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"{marker}: not a readable ONNX export of attention-seq2seq ({error})") from None
        self.spec = spec
        self.interface = spec["interface"]
        self.generation = spec["generation"]
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        if intra_threads:
            options.intra_op_num_threads = intra_threads
        options.inter_op_num_threads = 1
        providers = list(providers or ["CPUExecutionProvider"])
        self.sessions = {}
        for name in ("encoder", "decoder"):
            path = self.folder / spec["files"][name]
            try:
                self.sessions[name] = onnxruntime.InferenceSession(str(path), options, providers=providers)
            except Exception as error:  # onnxruntime raises its own exception types
                first = (str(error).strip().splitlines() or [type(error).__name__])[0]
                raise ValueError(f"{path}: cannot load ({first})") from None
        self.decoder_inputs = [i.name for i in self.sessions["decoder"].get_inputs()]
        self.batch_axes = self.interface["batch_axes"]
        self.eos = np.array(self.generation["eos_token_id"], dtype=np.int64)
        self.pad_id = int(self.generation["pad_token_id"])
        self.start_id = int(self.generation["decoder_start_token_id"])

    # ---------------------------------------------------------------------------------------
    # the graphs

    def _take(self, tensors: dict, rows: np.ndarray) -> dict:
        """Select (or repeat) batch rows of every tensor, each along its own batch axis."""
        return {name: np.take(value, rows, axis=self.batch_axes[name]) for name, value in tensors.items()}

    def encode(self, rows: Sequence[Sequence[int]]) -> tuple[dict, dict]:
        """Right-pad ``rows`` and run the encoder: (source tensors incl. ``attention_mask``, initial state)."""
        width = max(len(row) for row in rows)
        input_ids = np.full((len(rows), width), self.pad_id, dtype=np.int64)
        attention_mask = np.zeros((len(rows), width), dtype=np.int64)
        for i, row in enumerate(rows):
            input_ids[i, : len(row)] = row
            attention_mask[i, : len(row)] = 1
        outputs = self.sessions["encoder"].run(None, {"input_ids": input_ids, "attention_mask": attention_mask})
        named = dict(zip(self.interface["encoder_outputs"], outputs))
        sources = {name: named[name] for name in self.interface["sources"]}
        sources["attention_mask"] = attention_mask
        state = {}
        for name in self.interface["state"]:
            initial = self.interface["initial_state"][name]
            if initial == "encoder":
                state[name] = named[name]
            else:  # an empty key/value cache: ["batch", heads, 0, head_dim] per layer
                shape = [len(rows) if d == "batch" else d for d in initial]
                state[name] = np.zeros(shape, dtype=np.float32)
        return sources, state

    def step(
        self, tokens: np.ndarray, position: int, sources: dict, state: dict
    ) -> tuple[np.ndarray, np.ndarray, dict]:
        """One decoder step: ``tokens`` (rows,) at target position ``position`` →
        (logits, their log softmax, both (rows, vocab) float32; the next state)."""
        feed = {"decoder_input_ids": tokens.reshape(-1, 1).astype(np.int64), "position": np.array([position])}
        feed.update(sources)
        feed.update(state)
        outputs = self.sessions["decoder"].run(None, {name: feed[name] for name in self.decoder_inputs})
        return outputs[0], outputs[1], dict(zip(self.interface["state"], outputs[2:]))

    # ---------------------------------------------------------------------------------------
    # lengths

    def max_length(self, max_new_tokens: int | None = None, max_length: int | None = None) -> int:
        """The longest decoder sequence (start token included), as ``generate`` resolves it: the
        caller's ``max_new_tokens``/``max_length``, else the export's defaults capped at the
        decoder's position table.

        Raises:
            ValueError: an explicit length the position table cannot represent.
        """
        positions = self.generation.get("max_decoder_positions")
        if max_new_tokens is not None or max_length is not None:
            length = 1 + max_new_tokens if max_new_tokens is not None else max_length
            if positions and length > positions + 1:
                raise ValueError(
                    f"asked for up to {length} decoder tokens, but max_position_embeddings={positions} lets the "
                    f"decoder read at most {positions} positions; ask for fewer tokens"
                )
            return int(length)
        default = self.generation.get("max_new_tokens")
        length = 1 + default if default is not None else (self.generation.get("max_length") or 20)
        return int(min(length, positions) if positions else length)

    # ---------------------------------------------------------------------------------------
    # search

    def generate(
        self,
        rows: Sequence[Sequence[int]],
        *,
        num_beams: int | None = None,
        num_return_sequences: int = 1,
        max_new_tokens: int | None = None,
        max_length: int | None = None,
        min_new_tokens: int | None = None,
        length_penalty: float | None = None,
        early_stopping: bool | str | None = None,
    ) -> list[list[Hypothesis]]:
        """``num_return_sequences`` hypotheses per row of source token ids (``</s>`` included, no
        padding), best first; defaults from the export's ``generation_config``. ``min_new_tokens``:
        ``</s>`` is impossible before that many tokens (transformers' ``MinNewTokensLengthLogitsProcessor``).

        Raises:
            ValueError: ``num_return_sequences`` above ``num_beams``, or an impossible length.
        """
        num_beams = int(num_beams or self.generation.get("num_beams") or 1)
        alpha = self.generation.get("length_penalty", 1.0) if length_penalty is None else length_penalty
        alpha = 1.0 if alpha is None else float(alpha)
        stopping = self.generation.get("early_stopping", False) if early_stopping is None else early_stopping
        if num_return_sequences > num_beams:
            raise ValueError(f"num_return_sequences={num_return_sequences} needs num_beams >= {num_return_sequences}")
        length = self.max_length(max_new_tokens, max_length)
        minimum = self.generation.get("min_new_tokens") if min_new_tokens is None else min_new_tokens
        minimum = int(minimum or 0)
        if not rows:
            return []
        if num_beams == 1:
            return [[h] for h in self._greedy(rows, length, alpha, minimum)]
        return self._beam_search(rows, num_beams, num_return_sequences, length, alpha, stopping, minimum)

    def _forbid_eos(self, scores: np.ndarray, generated: int, minimum: int) -> np.ndarray:
        """Scores with ``</s>`` at -inf while fewer than ``minimum`` tokens are generated."""
        if generated < minimum:
            scores = scores.copy()
            scores[:, self.eos] = -np.inf
        return scores

    def _greedy(self, rows, max_length: int, alpha: float, minimum: int = 0) -> list[Hypothesis]:
        sources, state = self.encode(rows)
        alive = np.arange(len(rows))  # the input rows still decoding, in batch order
        generated = [[] for _ in rows]
        logprob = np.zeros(len(rows), dtype=np.float32)
        tokens = np.full(len(rows), self.start_id, dtype=np.int64)
        for position in range(max_length - 1):
            logits, log_probs, state = self.step(tokens, position, sources, state)
            tokens = self._forbid_eos(logits, position, minimum).argmax(axis=-1)
            chosen = np.take_along_axis(log_probs, tokens[:, None], axis=-1)[:, 0]
            logprob[alive] += chosen
            for row, token in zip(alive, tokens):
                generated[row].append(int(token))
            ended = np.isin(tokens, self.eos)
            if ended.all():
                break
            if ended.any():
                keep = np.flatnonzero(~ended)
                alive, tokens = alive[keep], tokens[keep]
                sources, state = self._take(sources, keep), self._take(state, keep)
        return [
            Hypothesis(tokens, float(logprob[row]), float(logprob[row] / max(len(tokens), 1) ** alpha))
            for row, tokens in enumerate(generated)
        ]

    def _beam_search(self, rows, beams, returned, max_length, alpha, stopping, minimum: int = 0) -> list:
        n_sources = len(rows)
        sources, state = self.encode(rows)
        expand = np.repeat(np.arange(n_sources), beams)  # decoder row -> source row
        shared = bool(self.interface.get("shared_sources"))  # the step reads each source once for its beams
        if not shared:
            sources = self._take(sources, expand)
        state = self._take(state, expand)
        keep_k = max(2, 1 + len(self.eos)) * beams  # candidates kept per step, as transformers keeps
        top_num_beams = np.arange(keep_k) < beams

        running = np.full((n_sources, beams, max_length), self.pad_id, dtype=np.int64)
        running[:, :, 0] = self.start_id
        running_scores = np.zeros((n_sources, beams), dtype=np.float32)
        running_scores[:, 1:] = NEG_INF
        finished = running.copy()
        finished_scores = np.full((n_sources, beams), NEG_INF, dtype=np.float32)
        finished_done = np.zeros((n_sources, beams), dtype=bool)
        finished_length = np.ones((n_sources, beams), dtype=np.int64)
        open_sources = np.arange(n_sources)  # sources whose result can still change
        cur_len = 1
        while True:
            n_open = len(open_sources)
            tokens = running[open_sources, :, cur_len - 1].reshape(-1)
            _, log_probs, state = self.step(tokens, cur_len - 1, sources, state)
            vocab = log_probs.shape[-1]
            log_probs = self._forbid_eos(log_probs, cur_len - 1, minimum)
            scores = log_probs.reshape(n_open, beams, vocab) + running_scores[open_sources][:, :, None]
            flat = scores.reshape(n_open, beams * vocab)
            top = top_k(flat, keep_k)  # (open, keep_k)
            top_scores = np.take_along_axis(flat, top, axis=1)
            from_beam, top_tokens = top // vocab, top % vocab
            top_sequences = np.take_along_axis(running[open_sources], from_beam[:, :, None], axis=1)
            top_sequences[:, :, cur_len] = top_tokens
            hits = np.isin(top_tokens, self.eos) | (cur_len + 1 >= max_length)

            # the next running beams: the best K continuations that did not end
            running_candidates = top_scores + hits.astype(np.float32) * np.float32(NEG_INF)
            best = top_k(running_candidates, beams)
            running[open_sources] = np.take_along_axis(top_sequences, best[:, :, None], axis=1)
            running_scores[open_sources] = np.take_along_axis(running_candidates, best, axis=1)
            origin = np.take_along_axis(from_beam, best, axis=1)

            # finished hypotheses: ended among the top K, scored log p / length^alpha
            candidate = top_scores / np.float32((cur_len + 1 - 1) ** alpha)
            if stopping is True:
                candidate = candidate + finished_done[open_sources].all(axis=1, keepdims=True) * np.float32(NEG_INF)
            candidate = candidate + (~(hits & top_num_beams[None, :])) * np.float32(NEG_INF)
            merged_scores = np.concatenate([finished_scores[open_sources], candidate], axis=1)
            pick = top_k(merged_scores, beams)
            merged_sequences = np.concatenate([finished[open_sources], top_sequences], axis=1)
            merged_done = np.concatenate([finished_done[open_sources], hits & top_num_beams[None, :]], axis=1)
            merged_length = np.concatenate(
                [finished_length[open_sources], np.full((n_open, keep_k), cur_len + 1, dtype=np.int64)], axis=1
            )
            finished[open_sources] = np.take_along_axis(merged_sequences, pick[:, :, None], axis=1)
            finished_scores[open_sources] = np.take_along_axis(merged_scores, pick, axis=1)
            finished_done[open_sources] = np.take_along_axis(merged_done, pick, axis=1)
            finished_length[open_sources] = np.take_along_axis(merged_length, pick, axis=1)

            state = self._take(state, (origin + np.arange(n_open)[:, None] * beams).reshape(-1))
            cur_len += 1
            if stopping == "never" and alpha > 0.0:
                best_length = max_length - 1
            else:
                best_length = cur_len - 1
            best_possible = running_scores[open_sources][:, :1] / np.float32(best_length**alpha)
            worst_finished = np.where(
                finished_done[open_sources], finished_scores[open_sources].min(axis=1, keepdims=True), NEG_INF
            )
            still_open = (best_possible > worst_finished).any(axis=1)
            if stopping is True:
                still_open &= ~finished_done[open_sources].all(axis=1)
            if not still_open.any() or hits.all() or cur_len >= max_length:
                break
            if not still_open.all():
                keep = np.flatnonzero(still_open)
                open_sources = open_sources[keep]
                rows_kept = (keep[:, None] * beams + np.arange(beams)[None, :]).reshape(-1)
                sources = self._take(sources, keep if shared else rows_kept)
                state = self._take(state, rows_kept)

        results = []
        for source in range(n_sources):
            hypotheses = []
            for k in range(returned):
                length = int(finished_length[source, k])
                score = float(finished_scores[source, k])
                generated = length - 1
                hypotheses.append(
                    Hypothesis(finished[source, k, 1:length].tolist(), score * max(generated, 1) ** alpha, score)
                )
            results.append(hypotheses)
        return results

    # ---------------------------------------------------------------------------------------
    # text in, text out (the tokenizers library)

    def translate(self, sentences: Sequence[str], *, batch_size: int = 32, **generate_kwargs) -> list[str]:
        """Translations of ``sentences`` (best hypothesis each), tokenized with the folder's
        ``tokenizer.json`` (``pip install tokenizers``); ``generate_kwargs`` as in :meth:`generate`."""
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(self.folder / "tokenizer.json"))
        rows = [tokenizer.encode(s).ids if s.strip() else [] for s in sentences]
        order = sorted((i for i, row in enumerate(rows) if row), key=lambda i: -len(rows[i]))
        out = [""] * len(sentences)
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            for i, hypotheses in zip(batch, self.generate([rows[i] for i in batch], **generate_kwargs)):
                out[i] = tokenizer.decode(hypotheses[0].tokens, skip_special_tokens=True).strip()
        return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python onnx_runtime.py FOLDER [--num-beams K] < input > output``: one translation per line."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(description="Translate stdin with an attention-seq2seq ONNX export.")
    parser.add_argument("folder")
    parser.add_argument("--num-beams", type=int)
    parser.add_argument("--max-new-tokens", type=int)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, help="onnxruntime intra-op threads (default: one per core)")
    args = parser.parse_args(argv)
    model = OnnxSeq2Seq(args.folder, intra_threads=args.threads)
    lines = sys.stdin.read().splitlines()
    for line in model.translate(
        lines, batch_size=args.batch_size, num_beams=args.num_beams, max_new_tokens=args.max_new_tokens
    ):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
