"""Terminology constraints: lexically constrained beam search with dynamic beam allocation.

Every returned translation contains every constraint, a target phrase given as token ids (for
instance a term from a glossary). The search is Post & Vilar (2018), "Fast Lexically Constrained
Decoding with Dynamic Beam Allocation for Neural Machine Translation" (NAACL), which makes Hokamp &
Liu's (2017) grid beam search ("Lexically Constrained Decoding for Sequence Generation Using Grid
Beam Search", ACL) run with one beam of fixed size k:

* State. A hypothesis tracks, per constraint phrase, whether it is met and how far it has got into
  it (the longest prefix of the phrase that ends its output: a phrase being written that is
  abandoned loses its progress, and a phrase that shares a prefix with another is followed in
  both). Its number of met constraint tokens c is the length of the phrases it has met plus the
  progress of the phrase it is furthest into; c = C (all C constraint tokens of the sentence) only
  when every phrase is met.
* Candidates (Post & Vilar §3, "candidates"). Per hypothesis: its best continuations (as many as
  transformers' beam search keeps, 2k with one end-of-sentence token), the next token of each
  unmet phrase (the continuation of a phrase in progress, the first token of one not begun), and
  its single best token. Score: log p(y_1..y_t | x), the running sum of log-probabilities (after
  ``generate``'s logits processors, as in transformers' beam search).
* Banks (§3, "dynamic beam allocation"). The candidates that go on are grouped by c into C + 1
  banks; the beam of k is shared out evenly (the remainder to the top bank), a bank with fewer
  candidates than its share gives the rest to the bank below (the lowest to the top one), each
  bank keeps its best candidates, and any slot still free takes the best candidate left.
* Finishing. The end-of-sentence token is allowed only to a hypothesis that has met every
  constraint. As in transformers' beam search, a candidate that stops (end of sentence, or the
  length limit) and is among the k best of its bank C joins a list of the k best finished
  hypotheses, ranked by log p / length^α (α = ``length_penalty``, length = generated tokens with
  the end-of-sentence token), and the sentence stops by transformers' ``early_stopping`` rule.

Without constraints there is one bank, and every step selects exactly what transformers' own beam
search selects (the same candidates, the same float32 arithmetic, the same stopping rule): the
result equals ``generate(num_beams=k)``. A sentence whose constraints no hypothesis could meet
within the length limit (phrases that together are too long) returns the hypotheses that met the
most constraint tokens, with a warning; a single phrase longer than ``max_new_tokens`` is refused
before decoding. Identical phrases listed twice count once; phrases may overlap in the output.

The model is driven step by step through its own hooks, so both families and
``EnsembleForConditionalGeneration`` work: ``generate`` encodes the source, expands it for the beams
by the model's own ``_expand_inputs_for_generation`` (the Transformer keeps one encoder copy per
source) and builds the cache; each step calls ``prepare_inputs_for_generation`` and the forward, and
the cache follows the beams by the model's ``_reorder_cache`` (the Transformer's self-attention
cache) or the cache's ``reorder_cache`` (the RNN's state).

Three ways to call it (transformers 5.24):

* ``constrained_beam_search(model, input_ids, attention_mask, constraints, num_beams, max_new_tokens)``.
* ``model.generate(input_ids, custom_generate=constrained_decoding, constraints=..., num_beams=...)``:
  ``generate`` accepts a callable as ``custom_generate``, prepares the inputs as usual and calls it
  as the decoding loop (in place of ``_beam_search``), passing it the ``constraints`` keyword
  because the callable's signature names it.
* ``model.generate(input_ids, custom_generate=FOLDER, trust_remote_code=True, constraints=...)`` for
  a model folder (or Hub repository) holding ``custom_generate/generate.py``: this file, which
  the export ships as it is (hub/export.py's ``write_custom_generate``; it imports only torch and
  transformers). transformers 5.24 loads it from a local folder as from
  the Hub, and ``from_pretrained(FOLDER, trust_remote_code=True)`` then replaces the loaded
  model's ``generate`` by this file's :func:`generate`, which decodes as transformers does when no
  ``constraints`` are given.

``constraints[i]`` is the list of phrases of source sentence i (possibly empty); a phrase is the
token ids of ``tokenizer(text_target=phrase, add_special_tokens=False)["input_ids"]``
(translation/files.py's ``read_constraints_file`` reads a file of them).
"""

from __future__ import annotations

import struct

import torch
from transformers.generation import GenerateBeamEncoderDecoderOutput
from transformers.utils import logging

logger = logging.get_logger(__name__)

# The score transformers gives beams that must not go on; also the "no finished hypothesis yet"
# score of its early-stopping test.
_DEAD = -1.0e9
# Where generate keeps the decoder cache in model_kwargs (transformers' ALL_CACHE_NAMES).
_CACHE_NAMES = ("cache", "state", "mems", "past_buckets_states")


def _float32(x: float) -> float:
    """``x`` rounded to float32: one float32 operation done in float64 and rounded gives the
    float32 result, so scores computed here equal the tensors transformers computes."""
    return struct.unpack("f", struct.pack("f", x))[0]


def _failure_table(phrase: tuple[int, ...]) -> list[int]:
    """Knuth-Morris-Pratt: entry i is the length of the longest proper prefix of phrase[:i+1] that
    is also a suffix of it (where a partial match falls back to when the next token differs)."""
    table = [0] * len(phrase)
    matched = 0
    for i in range(1, len(phrase)):
        while matched and phrase[i] != phrase[matched]:
            matched = table[matched - 1]
        if phrase[i] == phrase[matched]:
            matched += 1
        table[i] = matched
    return table


class SentenceConstraints:
    """One sentence's distinct phrases and the constraint state of a hypothesis.

    A state is a tuple with one entry per phrase: -1 when the phrase is met, else the number of its
    tokens that end the hypothesis (0: none). States are immutable (hypotheses share them).

    Args:
        phrases: the phrases, each a non-empty sequence of token ids (checked by
            :func:`check_constraints`); repeats are dropped.
    """

    def __init__(self, phrases):
        distinct = []
        for phrase in phrases:
            phrase = tuple(int(t) for t in phrase)
            if phrase not in distinct:
                distinct.append(phrase)
        self.phrases = tuple(distinct)
        self.total = sum(len(p) for p in self.phrases)  # C: the sentence's constraint tokens
        self._tables = [_failure_table(p) for p in self.phrases]
        self.start = (0,) * len(self.phrases)
        self._advanced = {}

    def advance(self, state: tuple, token: int) -> tuple:
        """The state after writing ``token``."""
        key = (state, token)
        if key in self._advanced:
            return self._advanced[key]
        after = []
        for phrase, table, matched in zip(self.phrases, self._tables, state):
            if matched >= 0:
                while matched and phrase[matched] != token:
                    matched = table[matched - 1]
                if phrase[matched] == token:
                    matched += 1
                if matched == len(phrase):
                    matched = -1
            after.append(matched)
        after = tuple(after)
        self._advanced[key] = after
        return after

    def met_tokens(self, state: tuple) -> int:
        """c: the tokens of the met phrases plus the progress into the phrase furthest begun."""
        met = sum(len(p) for p, m in zip(self.phrases, state) if m < 0)
        return met + max((m for m in state if m > 0), default=0)

    @staticmethod
    def all_met(state: tuple) -> bool:
        return all(m < 0 for m in state)

    def next_tokens(self, state: tuple) -> set[int]:
        """The next token of every unmet phrase."""
        return {p[m] for p, m in zip(self.phrases, state) if m >= 0}


def check_constraints(constraints, batch_size: int, max_new_tokens: int, vocab_size=None, banned=None):
    """Check the constraints of a batch and build one :class:`SentenceConstraints` per sentence.

    Args:
        constraints: None (no constraints) or ``batch_size`` lists of phrases, each a non-empty list
            of token ids.
        batch_size: the number of source sentences.
        max_new_tokens: the most tokens a hypothesis may generate.
        vocab_size: token ids must be below it (None: not checked).
        banned: ``{token id: name}`` of tokens no phrase may contain (end of sentence, padding).

    Returns:
        list[SentenceConstraints], one per sentence.

    Raises:
        ValueError: (one line, naming the sentence index and the constraint) a list of another
            length, a phrase that is empty, not a list of integers, holds an id outside the
            vocabulary or a banned token, or is longer than ``max_new_tokens``.
    """
    if constraints is None:
        return [SentenceConstraints([]) for _ in range(batch_size)]
    if isinstance(constraints, (str, bytes)) or not hasattr(constraints, "__len__"):
        raise ValueError(f"constraints must be a list with one list of phrases per sentence, got {type(constraints)}")
    if len(constraints) != batch_size:
        raise ValueError(
            f"constraints has {len(constraints)} entries for {batch_size} source sentence(s); "
            "give one list of phrases (possibly empty) per sentence"
        )
    banned = banned or {}
    built = []
    for i, phrases in enumerate(constraints):
        phrases = [] if phrases is None else phrases
        if isinstance(phrases, (str, bytes, int)):
            raise ValueError(f"sentence {i}: constraints must be a list of phrases (lists of token ids): {phrases!r}")
        for j, phrase in enumerate(phrases):
            if isinstance(phrase, torch.Tensor):
                phrase = phrase.tolist()
            if isinstance(phrase, (str, bytes, int)) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in phrase
            ):
                raise ValueError(f"sentence {i}: constraint {j} must be a list of token ids, got {phrase!r}")
            phrase = list(phrase)
            if not phrase:
                raise ValueError(f"sentence {i}: constraint {j} is an empty phrase; a constraint needs a token or more")
            for token in phrase:
                if token < 0 or (vocab_size is not None and token >= vocab_size):
                    raise ValueError(
                        f"sentence {i}: constraint {phrase} has token id {token}, outside the vocabulary "
                        f"(0..{vocab_size - 1 if vocab_size is not None else 'n'})"
                    )
                if token in banned:
                    raise ValueError(
                        f"sentence {i}: constraint {phrase} contains the {banned[token]} token {token}, "
                        "which no constraint may contain"
                    )
            if len(phrase) > max_new_tokens:
                raise ValueError(
                    f"sentence {i}: constraint {phrase} has {len(phrase)} tokens but max_new_tokens={max_new_tokens} "
                    f"lets a translation have at most {max_new_tokens}; shorten it or raise max_new_tokens"
                )
        built.append(SentenceConstraints(phrases))
    return built


def _bank_sizes(beam_size: int, counts: list[int]) -> list[int]:
    """Post & Vilar's allocation: ``beam_size`` slots over len(counts) banks, evenly with the
    remainder to the top bank; going down from the top, a bank with fewer candidates than slots
    passes the spare slots to the bank below it (the lowest to the top one)."""
    n_banks = len(counts)
    share, rest = divmod(beam_size, n_banks)
    sizes = [share] * n_banks
    sizes[-1] += rest
    for bank in range(n_banks - 1, -1, -1):
        spare = sizes[bank] - counts[bank]
        if spare > 0:
            sizes[bank] -= spare
            sizes[(bank - 1) % n_banks] += spare
    return sizes


def _id_list(value) -> list[int]:
    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        return [int(v) for v in value.reshape(-1).tolist()]
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def _cache_key(model_kwargs: dict):
    return next((name for name in _CACHE_NAMES if model_kwargs.get(name) is not None), None)


def _reorder(model, model_kwargs: dict, beam_idx: torch.LongTensor) -> None:
    """Make the cache follow the beams, by the model's own rule (as transformers' beam search)."""
    key = _cache_key(model_kwargs)
    if key is None:
        return
    cache = model_kwargs[key]
    if hasattr(model, "_reorder_cache"):
        model_kwargs[key] = model._reorder_cache(cache, beam_idx)
    elif hasattr(cache, "reorder_cache"):
        cache.reorder_cache(beam_idx)
    else:
        raise ValueError(f"{type(model).__name__} cannot be used for beam search: its cache cannot be reordered")


class _Finished:
    """A finished (or fallback) hypothesis: its tokens, normalised score, raw log p, met tokens."""

    __slots__ = ("tokens", "score", "log_prob", "met")

    def __init__(self, tokens, score, log_prob, met):
        self.tokens, self.score, self.log_prob, self.met = tokens, score, log_prob, met


def constrained_decoding(
    model,
    input_ids: torch.LongTensor,
    logits_processor=None,
    stopping_criteria=None,
    generation_config=None,
    synced_gpus: bool = False,
    streamer=None,
    constraints=None,
    **model_kwargs,
):
    """The decoding loop of constrained beam search, as ``generate(custom_generate=...)`` calls it.

    ``generate`` has already encoded the source, expanded the inputs for the beams and built the
    cache; see the module docstring for the algorithm.

    Args:
        model: the seq2seq model (``self`` of ``generate``).
        input_ids: (batch * num_beams, prompt_len) decoder prompt (the start token), one row per beam.
        logits_processor: ``generate``'s processors, applied to each step's log-probabilities.
        stopping_criteria: ``generate``'s stopping criteria (length limit, end of sentence, ...);
            a candidate that meets one stops.
        generation_config: ``num_beams`` (k), ``num_return_sequences``, ``max_length``,
            ``length_penalty``, ``early_stopping``, ``return_dict_in_generate``, ``output_scores``.
        synced_gpus, streamer: accepted for ``generate``'s signature; not used.
        constraints: None or one list of phrases (lists of token ids) per source sentence.
        model_kwargs: ``encoder_outputs``, ``attention_mask``, ``cache``, ``use_cache``, ... as
            ``generate`` prepared them.

    Returns:
        LongTensor (batch * num_return_sequences, length): start token, tokens, end-of-sentence
        token, padded with ``pad_token_id``; the best hypothesis of each sentence first. With
        ``return_dict_in_generate=True`` a ``GenerateBeamEncoderDecoderOutput`` (``sequences`` and,
        with ``output_scores=True``, ``sequences_scores``: log p / length^α).

    Raises:
        ValueError: sampling asked for, more returned sequences than beams, or constraints refused
            by :func:`check_constraints`.
    """
    config = generation_config
    if config.do_sample:
        raise ValueError("constrained beam search does not sample: drop do_sample=True")
    num_beams = int(config.num_beams or 1)
    num_return = int(config.num_return_sequences or 1)
    if num_return > num_beams:
        raise ValueError(f"num_return_sequences={num_return} is more than num_beams={num_beams}")
    rows, prompt_len = input_ids.shape
    if rows % num_beams:
        raise ValueError(f"{rows} decoder rows are not a multiple of num_beams={num_beams}")
    batch = rows // num_beams
    device = input_ids.device
    max_length = int(config.max_length)
    eos_ids = _id_list(getattr(config, "_eos_token_tensor", None)) or _id_list(config.eos_token_id)
    pad_ids = _id_list(getattr(config, "_pad_token_tensor", None)) or _id_list(config.pad_token_id)
    pad_id = pad_ids[0] if pad_ids else (eos_ids[0] if eos_ids else 0)
    banned = {pad_id: "padding"} if pad_ids else {}
    banned.update({e: "end-of-sentence" for e in eos_ids})
    vocab_size = getattr(model.config, "vocab_size", None)
    sentences = check_constraints(constraints, batch, max_length - prompt_len, vocab_size, banned)
    eos_set = set(eos_ids)
    length_penalty = config.length_penalty
    early_stopping = config.early_stopping
    per_row = max(2, 1 + len(eos_ids)) * num_beams  # transformers' beams_to_keep
    is_encoder_decoder = model.config.is_encoder_decoder
    if stopping_criteria is None or len(stopping_criteria) == 0:
        stopping_criteria = None

    # Beam r belongs to sentence r // num_beams. Only the first beam of each sentence starts alive.
    running_scores = [0.0 if r % num_beams == 0 else _DEAD for r in range(rows)]
    alive = [r % num_beams == 0 for r in range(rows)]
    states = [sentences[r // num_beams].start for r in range(rows)]
    finished = [[] for _ in range(batch)]
    fallback = [[] for _ in range(batch)]
    improvable = [True] * batch  # transformers' is_early_stop_heuristic_unsatisfied
    sequences = input_ids
    cur_len = prompt_len

    def active(i: int) -> bool:
        full = early_stopping is True and len(finished[i]) >= num_beams
        return improvable[i] and not full and any(alive[i * num_beams : (i + 1) * num_beams])

    prefill = getattr(model, "_prefill", None)
    if prefill is not None:
        outputs = prefill(input_ids, config, model_kwargs)
    else:
        outputs = model(**model.prepare_inputs_for_generation(input_ids, **model_kwargs), return_dict=True)
    while cur_len < max_length and any(active(i) for i in range(batch)):
        if outputs is None:
            step_length = 1 if model_kwargs.get("use_cache") else None
            model_inputs = model.prepare_inputs_for_generation(
                sequences, next_sequence_length=step_length, **model_kwargs
            )
            outputs = model(**model_inputs, return_dict=True)
        model_kwargs = model._update_model_kwargs_for_generation(
            outputs, model_kwargs, is_encoder_decoder=is_encoder_decoder
        )
        logits = outputs.logits[:, -1, :].to(copy=True, dtype=torch.float32, device=device)
        outputs = None
        log_probs = torch.nn.functional.log_softmax(logits, dim=-1)
        if logits_processor is not None:
            log_probs = logits_processor(sequences, log_probs)
        step_scores = log_probs + torch.tensor(running_scores, dtype=torch.float32, device=device)[:, None]
        top_values, top_tokens = step_scores.topk(min(per_row, step_scores.shape[-1]), dim=-1)
        top_values, top_tokens = top_values.tolist(), top_tokens.tolist()

        # 1. The candidates of every alive beam of every active sentence (parallel lists of row, token,
        # score): its best continuations (the first is its single best token), then the next token of
        # each unmet phrase that is not among them.
        candidate_rows, candidate_tokens, candidate_scores = [], [], []
        extra_rows, extra_tokens, extra_at = [], [], []
        for i in range(batch):
            if not active(i):
                continue
            constraints_i = sentences[i]
            for r in range(i * num_beams, (i + 1) * num_beams):
                if not alive[r]:
                    continue
                seen = set(top_tokens[r])
                for value, token in zip(top_values[r], top_tokens[r]):
                    candidate_rows.append(r)
                    candidate_tokens.append(token)
                    candidate_scores.append(value)
                for token in sorted(constraints_i.next_tokens(states[r]) - seen):
                    extra_at.append(len(candidate_rows))
                    candidate_rows.append(r)
                    candidate_tokens.append(token)
                    candidate_scores.append(None)
                    extra_rows.append(r)
                    extra_tokens.append(token)
        if extra_rows:
            values = step_scores[
                torch.tensor(extra_rows, device=device), torch.tensor(extra_tokens, device=device)
            ].tolist()
            for at, value in zip(extra_at, values):
                candidate_scores[at] = value

        # 2. Which candidates stop (generate's criteria on the extended sequences).
        if not candidate_rows:
            break
        if stopping_criteria is not None:
            extended = torch.cat(
                [
                    sequences.index_select(0, torch.tensor(candidate_rows, device=device)),
                    torch.tensor(candidate_tokens, device=device, dtype=sequences.dtype)[:, None],
                ],
                dim=-1,
            )
            stops = stopping_criteria(extended, None).tolist()
        else:
            stops = [t in eos_set or cur_len + 1 >= max_length for t in candidate_tokens]

        # 3. Per sentence: finished hypotheses, then the banks of the next beam.
        length_scale = _float32((cur_len + 1 - prompt_len) ** length_penalty)
        beam_idx = list(range(rows))
        new_tokens = [pad_id] * rows
        new_scores = [_DEAD] * rows
        new_alive = [False] * rows
        new_states = list(states)
        by_sentence = {}
        for n, r in enumerate(candidate_rows):
            by_sentence.setdefault(r // num_beams, []).append(n)
        for i, members in by_sentence.items():
            constraints_i = sentences[i]
            may_finish = improvable[i] and not (early_stopping is True and len(finished[i]) >= num_beams)
            top_bank, going_on = [], []
            for n in members:
                score, r, token = candidate_scores[n], candidate_rows[n], candidate_tokens[n]
                if score == float("-inf") or score != score:
                    continue
                state = constraints_i.advance(states[r], token)
                done = constraints_i.all_met(state)
                if token in eos_set and not done:
                    continue  # the end of sentence only after every constraint
                candidate = (score, r, token, state)
                if done:
                    top_bank.append((candidate, stops[n]))
                if not stops[n]:
                    going_on.append(candidate)
                elif not done:  # stopped (length limit) before meeting every constraint
                    met = constraints_i.met_tokens(state)
                    tokens = sequences[r].tolist() + [token]
                    fallback[i].append(_Finished(tokens, _float32(score / length_scale), score, met))
            fallback[i] = sorted(fallback[i], key=lambda h: (-h.met, -h.score))[:num_beams]
            # Stopped candidates among the k best of the top bank join the finished list.
            if may_finish:
                top_bank.sort(key=lambda item: -item[0][0])
                new = [
                    _Finished(
                        sequences[r].tolist() + [token], _float32(score / length_scale), score, constraints_i.total
                    )
                    for (score, r, token, _), stopped in top_bank[:num_beams]
                    if stopped
                ]
                if new:
                    finished[i] = sorted(finished[i] + new, key=lambda h: -h.score)[:num_beams]
            # Dynamic beam allocation over banks 0..C of the candidates that go on.
            banks = [[] for _ in range(constraints_i.total + 1)]
            for candidate in going_on:
                banks[constraints_i.met_tokens(candidate[3])].append(candidate)
            sizes = _bank_sizes(num_beams, [len(b) for b in banks])
            chosen, left = [], []
            for bank, size in zip(banks, sizes):
                bank.sort(key=lambda c: -c[0])
                chosen += bank[:size]
                left += bank[size:]
            if len(chosen) < num_beams:
                left.sort(key=lambda c: -c[0])
                chosen += left[: num_beams - len(chosen)]
            chosen.sort(key=lambda c: -c[0])
            for slot, (score, r, token, state) in enumerate(chosen):
                row = i * num_beams + slot
                beam_idx[row], new_tokens[row], new_scores[row] = r, token, score
                new_alive[row], new_states[row] = True, state

        # 4. The next beam: sequences, cache, scores; then transformers' early-stopping test.
        beam_index = torch.tensor(beam_idx, device=device)
        appended = torch.tensor(new_tokens, device=device, dtype=sequences.dtype)[:, None]
        sequences = torch.cat([sequences.index_select(0, beam_index), appended], dim=-1)
        _reorder(model, model_kwargs, beam_index)
        running_scores, alive, states = new_scores, new_alive, new_states
        cur_len += 1
        if early_stopping == "never" and length_penalty > 0.0:
            best_length = max_length - prompt_len
        else:
            best_length = cur_len - prompt_len
        best_scale = _float32(best_length**length_penalty)
        for i in range(batch):
            if not improvable[i]:
                continue
            scores_i = [running_scores[r] for r in range(i * num_beams, (i + 1) * num_beams) if alive[r]]
            if not scores_i:
                improvable[i] = False
                continue
            best = _float32(max(scores_i) / best_scale)
            worst = min(h.score for h in finished[i]) if len(finished[i]) >= num_beams else _DEAD
            improvable[i] = best > worst

    # 5. The num_return best finished hypotheses per sentence.
    chosen_rows, chosen_scores = [], []
    for i in range(batch):
        ranked = list(finished[i])
        if len(ranked) < num_return:
            missing = sentences[i].total > 0
            extra = list(fallback[i])
            for r in range(i * num_beams, (i + 1) * num_beams):
                if alive[r]:
                    extra.append(
                        _Finished(
                            sequences[r].tolist(),
                            _float32(running_scores[r] / _float32((cur_len - prompt_len) ** length_penalty)),
                            running_scores[r],
                            sentences[i].met_tokens(states[r]),
                        )
                    )
            extra.sort(key=lambda h: (-h.met, -h.score))
            ranked += extra[: num_return - len(ranked)]
            if missing and extra:
                logger.warning(
                    f"constrained beam search: no hypothesis of sentence {i} met every constraint within "
                    f"max_new_tokens={max_length - prompt_len}; returning those that met the most constraint tokens"
                )
        while len(ranked) < num_return:
            ranked.append(_Finished(input_ids[i * num_beams].tolist(), _DEAD, _DEAD, 0))
        for hypothesis in ranked[:num_return]:
            chosen_rows.append(hypothesis.tokens)
            chosen_scores.append(hypothesis.score)
    width = max(len(tokens) for tokens in chosen_rows)
    output = torch.full((len(chosen_rows), width), pad_id, dtype=input_ids.dtype, device=device)
    for n, tokens in enumerate(chosen_rows):
        output[n, : len(tokens)] = torch.tensor(tokens, dtype=input_ids.dtype, device=device)
    if config.return_dict_in_generate:
        scores = torch.tensor(chosen_scores, dtype=torch.float32, device=device) if config.output_scores else None
        return GenerateBeamEncoderDecoderOutput(sequences=output, sequences_scores=scores)
    return output


def constrained_beam_search(
    model,
    input_ids: torch.LongTensor,
    attention_mask: torch.Tensor | None,
    constraints,
    num_beams: int,
    max_new_tokens: int,
    length_penalty: float = 1.0,
    num_return_sequences: int = 1,
    **generate_kwargs,
) -> torch.LongTensor:
    """Translate ``input_ids`` so that every output contains each of its sentence's constraints.

    Runs ``generate`` with :func:`constrained_decoding` as its decoding loop (``custom_generate``),
    so the model's own encoder, input expansion, cache and ``prepare_inputs_for_generation`` are
    used; any ``GenerationMixin`` encoder-decoder model works (both families, an ensemble).

    Args:
        model: a seq2seq model (``...ForConditionalGeneration``, ``EnsembleForConditionalGeneration``).
        input_ids: (batch, src_len) source token ids.
        attention_mask: (batch, src_len), 1 on real tokens, 0 on padding (None: no padding).
        constraints: ``batch`` lists of phrases; a phrase is a non-empty list of target token ids
            (``tokenizer(text_target=phrase, add_special_tokens=False)["input_ids"]``); an empty list:
            no constraint (that sentence decodes as plain beam search).
        num_beams: the beam size k (shared by the banks).
        max_new_tokens: the most tokens generated after the start token.
        length_penalty: α of the final ranking log p / length^α (as transformers).
        num_return_sequences: hypotheses returned per sentence (at most ``num_beams``).
        generate_kwargs: further ``generate`` options (``early_stopping``, ``no_repeat_ngram_size``,
            ``return_dict_in_generate``, ...).

    Returns:
        LongTensor (batch * num_return_sequences, length): start token, translation, end-of-sentence
        token, padded with ``pad_token_id``; sentence i's hypotheses in rows
        i * num_return_sequences ..., best first.

    Raises:
        ValueError: a constraint list of another length than the batch, an empty phrase, a phrase
            with an id outside the vocabulary or an end-of-sentence / padding token, or a phrase
            longer than ``max_new_tokens`` (one line naming the sentence index and the phrase).
    """
    return type(model).generate(
        model,
        input_ids=input_ids,
        attention_mask=attention_mask,
        custom_generate=constrained_decoding,
        constraints=constraints,
        num_beams=num_beams,
        max_new_tokens=max_new_tokens,
        length_penalty=length_penalty,
        num_return_sequences=num_return_sequences,
        **generate_kwargs,
    )


def generate(*args, model, constraints=None, **kwargs):
    """The ``custom_generate`` entry point of an exported folder (``custom_generate/generate.py``).

    transformers calls it as ``generate(model=model, **generate_arguments)`` for
    ``model.generate(custom_generate=FOLDER, trust_remote_code=True, ...)``, and
    ``from_pretrained(FOLDER, trust_remote_code=True)`` makes it the loaded model's ``generate``
    (``model`` bound by keyword). With ``constraints`` it runs constrained beam search
    (:func:`constrained_decoding`); without, transformers' own ``generate`` unchanged.

    Args:
        model: the model (keyword).
        constraints: None, or one list of phrases (lists of token ids) per source sentence.
        args, kwargs: ``generate``'s arguments (``input_ids``, ``attention_mask``, ``num_beams``,
            ``max_new_tokens``, ...).

    Returns:
        What ``generate`` returns (see :func:`constrained_decoding` for the constrained case).
    """
    custom = kwargs.pop("custom_generate", None)
    kwargs.pop("trust_remote_code", None)  # used up in loading this file
    if constraints is None:
        if callable(custom):
            kwargs["custom_generate"] = custom
        return type(model).generate(model, *args, **kwargs)
    return type(model).generate(model, *args, custom_generate=constrained_decoding, constraints=constraints, **kwargs)


__all__ = [
    "SentenceConstraints",
    "check_constraints",
    "constrained_beam_search",
    "constrained_decoding",
    "generate",
]
