"""Translating raw text with a trained model: batching by length, cached beam search,
detokenization, one output line per input line.

n-best output (``Translator(..., nbest=K)``; ``attnmt translate --nbest K``, and ``--scores``
for K = 1): each input line gives K output lines, in input order, best first::

    line<TAB>rank<TAB>score<TAB>log_prob<TAB>text

``line`` is the input's line number (1-based, as the warnings count) and ``rank`` 1..K.
``log_prob`` is the hypothesis's raw log-probability under the model (the sum of its tokens'
log-probabilities, EOS included; PAD/BOS are never emitted and are not renormalised away),
``score`` the length-normalised ``log_prob / lp(|Y|)`` beam search ranks by (the GNMT
penalty of :func:`attnmt.decode.beam_search.length_penalty` with ``decode.alpha``, ``|Y|``
counting EOS); greedy decoding and samples are scored the same way. Both are float32
values written with 9 significant digits, which read back to the same float32.
An empty input line gives K lines with empty text and ``nan`` scores (nothing was
decoded); a beam slot no hypothesis filled (only in tiny search spaces) has ``-inf``.
``text`` is last, so splitting a line at its first four tabs reads it back
(:func:`parse_hypothesis`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, TextIO

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util
from jax.sharding import Mesh

from attnmt.common import BOS_ID, EOS_ID, PAD_ID
from attnmt.config.decode import DecodeConfig
from attnmt.config.model import ModelConfig
from attnmt.config.xla import compiler_options
from attnmt.data.batching import bucket_lengths
from attnmt.data.text_form import TextForm
from attnmt.data.tokenizer import Tokenizer
from attnmt.decode import beam_search as search
from attnmt.decode.batch_memory import agreed, fitting_sentences, per_device_budget
from attnmt.decode.coverage import COVERAGE_KEY, finish_penalty, last_cross_attention
from attnmt.decode.mbr import mbr_index, sentence_utility
from attnmt.decode.sharded import (
    data_parallel,
    decode_mesh,
    gather_rows,
    padded_rows,
    put_rows,
    replicate,
    row_shards,
)
from attnmt.decode.tree_grammar import TreeGrammar
from attnmt.model import layout
from attnmt.model.transformer import Transformer

log = logging.getLogger(__name__)


def _is_beam_invariant(path: tuple[str, ...]) -> bool:
    # Encoder-decoder keys/values depend only on the sentence, so every beam of a sentence
    # holds the same rows: reordering beams would copy them unchanged at every step.
    return "cross_attention" in path


def _step_fn(
    model: Transformer,
    params: Any,
    src_tokens: jax.Array,
    max_decode_len: int,
    rows: int,
    coverage: bool = False,
):
    """The decoder cache of a batch, expanded to `rows` per sentence, and the step closure.

    Returns (the cache the search carries and reorders, tokens_to_logits). The
    cross-attention keys/values stay outside the carried cache, as loop constants. With
    `coverage` the carried cache is `{"model": ..., COVERAGE_KEY: [rows, src_len]}`, the
    latter summing the attention of every step (attnmt.decode.coverage).
    """
    encoded = model.apply({"params": params}, src_tokens, method=Transformer.encode)
    start = jnp.full((src_tokens.shape[0], 1), model.config.decoder_start_id, jnp.int32)
    _, variables = model.apply(
        {"params": params},
        encoded,
        src_tokens,
        start,
        decode=True,
        max_decode_len=max_decode_len,
        method=Transformer.decode,
        mutable=["cache"],
    )
    invariant, carried = _split_invariant(search.expand_to_beams(variables["cache"], rows))
    encoded_rows = search.expand_to_beams(encoded, rows)
    src_rows = search.expand_to_beams(src_tokens, rows)
    collections = ["cache", "intermediates"] if coverage else ["cache"]

    def tokens_to_logits(tokens: jax.Array, cache: Any) -> tuple[jax.Array, Any]:
        own = cache["model"] if coverage else cache
        full = traverse_util.unflatten_dict({**traverse_util.flatten_dict(own), **invariant})
        logits, updated = model.apply(
            {"params": params, "cache": full},
            encoded_rows,
            src_rows,
            tokens,
            decode=True,
            method=Transformer.decode,
            mutable=collections,
        )
        kept = _split_invariant(updated["cache"])[1]
        if not coverage:
            return logits[:, 0], kept
        attended = last_cross_attention(updated["intermediates"], model.config.decoder_layers)
        return logits[:, 0], {"model": kept, COVERAGE_KEY: cache[COVERAGE_KEY] + attended}

    if coverage:
        zeros = jnp.zeros(src_rows.shape, jnp.float32)  # [sentences × rows, src_len]
        carried = {"model": carried, COVERAGE_KEY: zeros}
    return carried, tokens_to_logits


def _split_invariant(cache: Any) -> tuple[dict, Any]:
    """(the beam-invariant entries, flattened; the rest, as a tree) of a decoder cache."""
    flat = traverse_util.flatten_dict(cache)
    invariant = {k: v for k, v in flat.items() if _is_beam_invariant(k)}
    rest = {k: v for k, v in flat.items() if not _is_beam_invariant(k)}
    return invariant, traverse_util.unflatten_dict(rest)


_SELF_ATTENTION_CACHE = ("cached_key", "cached_value")


def grow_self_attention_caches(cache: Any, length: int) -> Any:
    """Pads every self-attention key/value cache in `cache` to room for `length` positions.

    Works on any pytree holding the model's caches (one model's, an ensemble's tuple, a
    wrapper's): leaves named cached_key/cached_value are [rows, heads, room, d] and get zero
    slots appended; the decode step reads the room from the array, and masks unfilled slots.
    """

    def pad(path: tuple[Any, ...], leaf: jax.Array) -> jax.Array:
        if getattr(path[-1], "key", None) not in _SELF_ATTENTION_CACHE:
            return leaf
        return jnp.pad(leaf, [(0, 0), (0, 0), (0, length - leaf.shape[2]), (0, 0)])

    return jax.tree_util.tree_map_with_path(pad, cache)


def prepare_search(
    configs: Sequence[ModelConfig],
    params_list: Sequence[Any],
    src_tokens: jax.Array,
    *,
    rows: int,
    max_decode_len: int,
    initial_cache_length: int = 0,
    coverage: bool = False,
) -> tuple[search.TokensToLogits, Any, search.CacheGrowth | None]:
    """`(tokens_to_logits, cache, cache_growth)` for the searches of beam_search.py.

    `rows` per sentence; several models are ensembled (their log-probabilities averaged).
    With `initial_cache_length` > 0 the self-attention caches start with that much room and
    double when full (`cache_growth`, to pass on to the search); with 0 they hold
    `max_decode_len` positions from the start and `cache_growth` is None. With `coverage`
    every model's cache also sums its attention over the source (attnmt.decode.coverage).
    """
    capacities = search.doubling_capacities(max_decode_len, initial_cache_length)
    fns, caches = [], []
    for config, params in zip(configs, params_list, strict=True):
        config, params = layout.for_decoding(config, params)
        model = Transformer(config)
        cache, step = _step_fn(model, params, src_tokens, capacities[0], rows, coverage)
        fns.append(step)
        caches.append(cache)
    growth = None
    if len(capacities) > 1:
        growth = search.CacheGrowth(capacities, grow_self_attention_caches)
    if len(fns) == 1:
        return fns[0], caches[0], growth
    return search.ensemble(fns), tuple(caches), growth


def decode_batch(
    configs: Sequence[ModelConfig],
    params_list: Sequence[Any],
    src_tokens: jax.Array,
    *,
    beam_size: int,
    alpha: float,
    max_len_offset: int,
    max_positions: int | None,
    initial_cache_length: int = 0,
    sampling: tuple[float, int] | None = None,
    row_keys: jax.Array | None = None,
    grammar: TreeGrammar | None = None,
    leaf_counts: jax.Array | None = None,
    word_pieces: tuple[jax.Array, jax.Array] | None = None,
    nbest: int = 0,
    coverage_penalty: float = 0.0,
) -> jax.Array | Hypotheses:
    """Best output token ids [batch, max_decode_len] for a padded source batch; with
    `sampling` = (temperature, top_k[, top_p]), row i's sample drawn from `row_keys[i]`
    instead. With a `grammar`, only trees with `leaf_counts[i]` leaves are written for row i
    (a copying grammar's leaves are `word_pieces`, as TreeGrammar.banned takes them).
    With `nbest` = K ≥ 1, the K best hypotheses with their scores instead (best_sequences).
    `coverage_penalty` β > 0 adds GNMT's coverage penalty to beam search's finished scores
    (attnmt.decode.coverage); greedy decoding and sampling have no use for it."""
    src_len = src_tokens.shape[1]
    max_decode_len = src_len + max_len_offset
    covering = coverage_penalty > 0 and sampling is None and beam_size > 1
    if max_positions is not None:
        max_decode_len = min(max_decode_len, max_positions)
    tokens_to_logits, cache, growth = prepare_search(
        configs,
        params_list,
        src_tokens,
        rows=1 if sampling is not None else beam_size,
        max_decode_len=max_decode_len,
        initial_cache_length=initial_cache_length,
        coverage=covering,
    )
    real_lengths = jnp.sum(src_tokens != PAD_ID, axis=1)
    # Empty filler rows finish at once; real rows may run to input length + offset (§6.1).
    max_lengths = jnp.where(real_lengths > 0, real_lengths + max_len_offset, 1)
    return best_sequences(
        tokens_to_logits,
        cache,
        growth,
        beam_size=beam_size,
        alpha=alpha,
        max_lengths=max_lengths,
        max_decode_len=max_decode_len,
        sampling=sampling,
        row_keys=row_keys,
        bos_id=configs[0].decoder_start_id,
        constraint=_grammar_constraint(grammar, leaf_counts, max_lengths, word_pieces),
        nbest=nbest,
        finish=finish_penalty(src_tokens, beam_size, coverage_penalty) if covering else None,
    )


def _grammar_constraint(
    grammar: TreeGrammar | None,
    leaf_counts: jax.Array | None,
    max_lengths: jax.Array,
    word_pieces: tuple[jax.Array, jax.Array] | None,
) -> search.TokenConstraint | None:
    """The search's TokenConstraint of `grammar` for rows with `leaf_counts` leaves."""
    if grammar is None:
        return None

    def constraint(prefixes: jax.Array, step: jax.Array, log_probs: jax.Array) -> jax.Array:
        return grammar.constrain(prefixes, step, log_probs, leaf_counts, max_lengths, word_pieces)

    return constraint


class Hypotheses(NamedTuple):
    """The n-best lists of a batch, best first (module docstring, "n-best output")."""

    sequences: jax.Array  # [batch, K, max_decode_len] int32, EOS included, PAD after it
    scores: jax.Array  # [batch, K] float32 log_prob / lp(|Y|)
    log_probs: jax.Array  # [batch, K] float32 sum of the tokens' log-probabilities


def _scored_single(sequences: jax.Array, log_probs: jax.Array, alpha: float) -> Hypotheses:
    """The one hypothesis per row of greedy decoding or sampling, as a 1-best list."""
    lengths = jnp.sum(sequences != PAD_ID, axis=1)  # [batch] tokens up to EOS, EOS included
    scores = log_probs / search.length_penalty(lengths, alpha)
    return Hypotheses(sequences[:, None], scores[:, None], log_probs[:, None])


def _sample(
    tokens_to_logits: search.TokensToLogits,
    cache: Any,
    growth: search.CacheGrowth | None,
    sampling: tuple[float, ...],
    row_keys: jax.Array,
    max_lengths: jax.Array,
    max_decode_len: int,
    bos_id: int,
) -> tuple[jax.Array, jax.Array]:
    """search.sample with `sampling` = (temperature, top_k[, top_p[, epsilon]])."""
    temperature, top_k, *rest = sampling
    return search.sample(
        tokens_to_logits,
        cache,
        row_keys,
        batch_size=max_lengths.shape[0],
        max_decode_len=max_decode_len,
        temperature=temperature,
        top_k=top_k,
        top_p=rest[0] if rest else 1.0,
        epsilon=rest[1] if len(rest) > 1 else 0.0,
        max_lengths=max_lengths,
        cache_growth=growth,
        bos_id=bos_id,
    )


def best_sequences(
    tokens_to_logits: search.TokensToLogits,
    cache: Any,
    growth: search.CacheGrowth | None,
    *,
    beam_size: int,
    alpha: float,
    max_lengths: jax.Array,
    max_decode_len: int,
    sampling: tuple[float, int] | None = None,
    row_keys: jax.Array | None = None,
    bos_id: int = BOS_ID,
    constraint: search.TokenConstraint | None = None,
    nbest: int = 0,
    finish: search.FinishPenalty | None = None,
) -> jax.Array | Hypotheses:
    """The best hypothesis per sentence, [batch, max_decode_len]: greedy decoding for beam
    1, beam search otherwise (with `finish`, its FinishPenalty); or a sample per sentence
    given `sampling` = (temperature, top_k[, top_p]) and a key per row. `max_lengths`
    [batch] bounds each output. `bos_id` is the decoder's start token, never emitted;
    `constraint` bans tokens during greedy or beam search, not sampling. With `nbest` = K
    (1 ≤ K ≤ beam_size; 1 for sampling) the K best as Hypotheses instead."""
    batch = max_lengths.shape[0]
    if not 0 <= nbest <= (1 if sampling is not None else beam_size):
        raise ValueError(f"nbest = {nbest}: 0 (sequences) or 1..beam {beam_size} (1 to sample)")
    if sampling is not None:
        sequences, log_probs = _sample(
            tokens_to_logits, cache, growth, sampling, row_keys, max_lengths, max_decode_len, bos_id
        )
        return _scored_single(sequences, log_probs, alpha) if nbest else sequences
    if beam_size == 1:
        sequences, log_probs = search.greedy_search(
            tokens_to_logits,
            cache,
            batch_size=batch,
            max_decode_len=max_decode_len,
            max_lengths=max_lengths,
            cache_growth=growth,
            bos_id=bos_id,
            constraint=constraint,
        )
        return _scored_single(sequences, log_probs, alpha) if nbest else sequences
    sequences, scores, log_probs = search.beam_search(
        tokens_to_logits,
        cache,
        batch_size=batch,
        beam_size=beam_size,
        max_decode_len=max_decode_len,
        alpha=alpha,
        max_lengths=max_lengths,
        cache_growth=growth,
        bos_id=bos_id,
        constraint=constraint,
        finish_penalty=finish,
        return_log_probs=True,
    )
    if nbest:
        return Hypotheses(sequences[:, :nbest], scores[:, :nbest], log_probs[:, :nbest])
    return sequences[:, 0]


def decoding_model_config(config: ModelConfig, decode: DecodeConfig) -> ModelConfig:
    """`config` with the compute dtype `decode.dtype` asks for ("" keeps the model's own)."""
    return dataclasses.replace(config, dtype=decode.dtype) if decode.dtype else config


class Hypothesis(NamedTuple):
    """One entry of an n-best list (module docstring, "n-best output")."""

    text: str
    score: float  # log_prob / lp(|Y|)
    log_prob: float


def format_hypothesis(line: int, rank: int, hypothesis: Hypothesis) -> str:
    """`line<TAB>rank<TAB>score<TAB>log_prob<TAB>text`, without a newline."""
    text = hypothesis.text.replace("\n", " ")
    return f"{line}\t{rank}\t{hypothesis.score:.9g}\t{hypothesis.log_prob:.9g}\t{text}"


def parse_hypothesis(line: str) -> tuple[int, int, Hypothesis]:
    """(line number, rank, hypothesis) of a line format_hypothesis wrote."""
    number, rank, score, log_prob, text = line.rstrip("\n").split("\t", 4)
    return int(number), int(rank), Hypothesis(text, float(score), float(log_prob))


def _search_rows(
    configs: Sequence[ModelConfig],
    decode: DecodeConfig,
    grammar: TreeGrammar | None,
    nbest: int,
) -> Callable[..., Any]:
    """decode_batch with the settings fixed: `(params_list, src_tokens, row_keys,
    leaf_counts, word_pieces)`, every argument after the parameters one row per sentence
    (or None), as sharded.data_parallel takes it."""
    learned = [c.max_length for c in configs if c.positional == "learned"]
    search = functools.partial(
        decode_batch,
        list(configs),
        beam_size=decode.beam_size,
        alpha=decode.alpha,
        max_len_offset=decode.max_len_offset,
        max_positions=min(learned) if learned else None,
        initial_cache_length=decode.initial_cache_length,
        sampling=(
            (decode.temperature, decode.top_k, decode.top_p, decode.epsilon)
            if decode.sample
            else None
        ),
        grammar=grammar,
        nbest=nbest,
        coverage_penalty=decode.coverage_penalty,
    )

    def rows(
        params_list: Any,
        src_tokens: jax.Array,
        row_keys: jax.Array | None,
        leaf_counts: jax.Array | None,
        word_pieces: tuple[jax.Array, jax.Array] | None,
    ) -> jax.Array | Hypotheses:
        return search(
            params_list,
            src_tokens,
            row_keys=row_keys,
            leaf_counts=leaf_counts,
            word_pieces=word_pieces,
        )

    return rows


class Translator:
    """Translates lists of sentences; compiled once per (batch, bucket length) shape.

    Each batch's sentences are split over the data axes of `mesh` (default: every device
    of every process, attnmt.decode.sharded), the parameters copied to every device; every
    process must then call it alike, with the same lines, and every process gets every
    output.

    With `nbest` = K ≥ 1 it also keeps the K best hypotheses with their scores
    (translate_nbest; translate_stream then writes the n-best format of the module docstring).
    """

    def __init__(
        self,
        configs: Sequence[ModelConfig],
        params_list: Sequence[Any],
        tokenizer: Tokenizer,
        decode: DecodeConfig,
        warn: Callable[[str], None] | None = None,
        grammar: TreeGrammar | None = None,
        nbest: int = 0,
        mesh: Mesh | None = None,
        reserved_bytes: int = 0,
        text_form: TextForm | None = None,
    ) -> None:
        if not configs:
            raise ValueError("at least one model is needed")
        if not 0 <= nbest <= (1 if decode.sample else decode.beam_size):
            raise ValueError(
                f"nbest {nbest} must be 1..decode.beam_size ({decode.beam_size}), 1 to sample"
            )
        self.tokenizer = tokenizer
        self.decode_config = decode
        # Sources take the form the model trained on; hypotheses come back as plain text.
        self.text_form = text_form or TextForm()
        self.nbest = nbest
        self._sampler: Translator | None = None
        # Minimum Bayes risk chooses among every hypothesis the beam finished.
        self._utility = sentence_utility(decode.mbr) if decode.mbr else None
        # Hypotheses the search keeps per input: `nbest`, or the whole beam for MBR.
        self._kept = decode.beam_size if decode.mbr else nbest
        # Sentences are split over every device of every process unless given a mesh (a
        # one-device mesh decodes as a single device would).
        self.mesh = decode_mesh() if mesh is None else mesh
        self._trained_configs = list(configs)
        self.set_params(params_list)
        configs = [
            decoding_model_config(layout.for_decoding(config, None)[0], decode)
            for config in configs
        ]
        self.max_source_length = min(c.max_length for c in configs)
        self.buckets = bucket_lengths(self.max_source_length, min_length=8)
        self._warn = warn or (lambda message: print(message, file=sys.stderr))
        # A grammar's trees have one leaf per whitespace-separated word of the input line.
        self._grammar = grammar
        self._fitting: dict[int, int] = {}  # longest input bucket → sentences per batch
        # Bytes per device that stay held while decoding (training's state, during training).
        self._reserved_bytes = reserved_bytes
        self._decode = data_parallel(
            _search_rows(configs, decode, grammar, self._kept),
            self.mesh,
            row_arguments=4,
            compiler_options=compiler_options(decode.xla_backend_optimization_level),
        )
        if decode.mbr and decode.mbr_samples:
            self._sampler = self._sampling_twin(tokenizer, warn)
            self._sampler.params_list = self.params_list

    def _sampling_twin(
        self, tokenizer: Tokenizer, warn: Callable[[str], None] | None
    ) -> Translator:
        """A translator that samples with this one's parameters and the beam's rows per
        batch: it draws the samples decode.mbr_samples weighs the beam's hypotheses against."""
        decode = self.decode_config
        sampling = dataclasses.replace(
            decode,
            sample=True,
            mbr="",
            mbr_samples=0,
            batch_sentences=decode.batch_sentences * decode.beam_size,
        )
        configs = self._trained_configs
        return Translator(
            configs,
            [None] * len(configs),
            tokenizer,
            sampling,
            warn=warn,
            nbest=1,
            mesh=self.mesh,
            reserved_bytes=self._reserved_bytes,
            text_form=self.text_form,
        )

    @classmethod
    def from_runs(cls, runs: Sequence[Any], decode: DecodeConfig, **options: Any) -> Translator:
        """A translator for runs loaded by attnmt/workdir.py's load_run (an ensemble when
        there are several; the first one's tokenizer); `options` as for the constructor."""
        models = [run.experiment.model for run in runs]
        params = [run.params for run in runs]
        form = TextForm.of(runs[0].experiment.data)
        return cls(models, params, runs[0].tokenizer, decode, text_form=form, **options)

    def set_params(self, params_list: Sequence[Any]) -> None:
        """The parameters to translate with, one per model, as training stores them (None:
        given later). Stacked (scan_layers) ones are converted here, once, not inside
        every compiled batch; prepare_search then finds the per-layer layout already. They
        are copied to every device of the mesh (from one device, or from the shards of a
        training mesh: then every process must call this alike)."""
        self.params_list = [
            None if params is None else replicate(layout.for_decoding(config, params)[1], self.mesh)
            for config, params in zip(self._trained_configs, params_list, strict=True)
        ]
        if self._sampler is not None:
            self._sampler.params_list = self.params_list

    def _source_ids(self, lines: Sequence[str], first_line: int) -> list[list[int]]:
        encoded = []
        for offset, line in enumerate(lines):
            ids = self.tokenizer.encode(self.text_form.source(line)) if line.strip() else []
            if len(ids) + 1 > self.max_source_length:
                self._warn(
                    f"warning: line {first_line + offset}: {len(ids) + 1} tokens exceed the "
                    f"model's maximum of {self.max_source_length}; translating the first "
                    f"{self.max_source_length - 1} only"
                )
                ids = ids[: self.max_source_length - 1]
            encoded.append([*ids, EOS_ID] if ids else [])
        return encoded

    def translate(self, lines: Sequence[str], first_line: int = 1) -> list[str]:
        """One output per input, in order; empty (or whitespace) input gives empty output.
        With decode.mbr, each output is the minimum-Bayes-risk choice among the beam's
        hypotheses (attnmt.decode.mbr)."""
        if self._utility is not None:
            decode = self.decode_config
            samples = self._samples(lines, first_line)
            return [
                candidates[
                    mbr_index(
                        [h.text for h in candidates],
                        [h.log_prob for h in candidates],
                        self._utility,
                        decode.mbr_weights,
                        samples=drawn,
                        sample_share=decode.mbr_sample_share,
                    )
                ].text
                for candidates, drawn in zip(
                    self._hypotheses(lines, first_line), samples, strict=True
                )
            ]
        if self.nbest:
            return [best[0].text for best in self.translate_nbest(lines, first_line)]
        outputs = [""] * len(lines)
        for index, ids in self._decoded(lines, first_line):
            outputs[index] = self.text_form.output(self.tokenizer.decode(ids.tolist()))
        return outputs

    def _samples(self, lines: Sequence[str], first_line: int) -> list[list[str]]:
        """decode.mbr_samples samples of each input (none without a sampler): draw 0 of line
        i is what decode.sample draws for it, draw k > 0 comes from
        fold_in(fold_in(PRNGKey(decode.seed), i), k), whatever the batching."""
        if self._sampler is None:
            return [[] for _ in lines]
        draws = [
            self._sampler._hypotheses(lines, first_line, draw=k)
            for k in range(self.decode_config.mbr_samples)
        ]
        return [[drawn[i][0].text for drawn in draws] for i in range(len(lines))]

    def translate_nbest(self, lines: Sequence[str], first_line: int = 1) -> list[list[Hypothesis]]:
        """The `nbest` best hypotheses of each input, best first, in input order; an empty
        (or whitespace) input gets `nbest` empty texts scored nan."""
        if not self.nbest:
            raise ValueError("this Translator was made without nbest")
        return [best[: self.nbest] for best in self._hypotheses(lines, first_line)]

    def _hypotheses(
        self, lines: Sequence[str], first_line: int, draw: int = 0
    ) -> list[list[Hypothesis]]:
        """Every hypothesis the search keeps for each input (`nbest`, or the whole beam
        with decode.mbr), best first, in input order; `draw` numbers a sampler's draws."""
        unscored = Hypothesis("", float("nan"), float("nan"))
        outputs = [[unscored] * self._kept for _ in lines]
        for index, (sequences, scores, log_probs) in self._decoded(lines, first_line, draw):
            texts = self.tokenizer.decode_batch(sequences.tolist())
            outputs[index] = [
                Hypothesis(self.text_form.output(text), float(score), float(log_prob))
                for text, score, log_prob in zip(texts, scores, log_probs, strict=True)
            ]
        return outputs

    def _decoded(
        self, lines: Sequence[str], first_line: int, draw: int = 0
    ) -> Iterator[tuple[int, Any]]:
        """(input index, its row of the search's host output) for every non-empty input."""
        sources = self._source_ids(lines, first_line)
        order = sorted((i for i, ids in enumerate(sources) if ids), key=lambda i: len(sources[i]))
        batch = self._sentences_per_batch(lines, sources, order, first_line)
        for start in range(0, len(order), batch):
            chunk = order[start : start + batch]
            placed = self._rows(lines, sources, chunk, first_line, batch, draw)
            result = gather_rows(self._decode(self.params_list, *placed))
            for row, index in enumerate(chunk):
                yield index, jax.tree.map(lambda x, row=row: x[row], result)

    def _sentences_per_batch(
        self, lines: Sequence[str], sources: list[list[int]], order: list[int], first_line: int
    ) -> int:
        """decode.batch_sentences, or fewer where a batch of the longest inputs would hold
        more than decode.memory_fraction of the memory (attnmt.decode.batch_memory); found
        once per longest input bucket."""
        config = self.decode_config
        batch = padded_rows(config.batch_sentences, self.mesh)
        if not order or not config.memory_fraction:
            return batch
        longest = next(b for b in self.buckets if b >= len(sources[order[-1]]))
        if longest not in self._fitting:
            devices = list(self.mesh.devices.flat)
            budget, where = per_device_budget(config.memory_fraction, devices, self._reserved_bytes)
            rows = batch
            if budget is not None:
                beams = 1 if config.sample else config.beam_size
                rows = fitting_sentences(
                    lambda n: self._decode.lower(
                        self.params_list, *self._rows(lines, sources, order[-n:], first_line, n)
                    ).compile(),
                    batch,
                    row_shards(self.mesh),
                    budget,
                    self._warn,
                    f"inputs up to {longest} tokens, beam {beams}; memory: {where}",
                )
            self._fitting[longest] = agreed(rows)
        return self._fitting[longest]

    def _rows(
        self,
        lines: Sequence[str],
        sources: list[list[int]],
        chunk: list[int],
        first_line: int,
        batch: int,
        draw: int = 0,
    ) -> tuple[Any, ...]:
        """The search's row arguments for the inputs `chunk` (indices, shortest first), on
        the mesh: source ids padded to a bucket length, sampling keys and grammar inputs;
        filler rows (empty, finished at once) up to `batch` rounded to the row shards."""
        rows = padded_rows(batch, self.mesh)
        length = next(b for b in self.buckets if b >= len(sources[chunk[-1]]))
        src = np.zeros((rows, length), np.int32)
        for row, index in enumerate(chunk):
            src[row, : len(sources[index])] = sources[index]
        keys = self._row_keys([first_line + index for index in chunk], rows, draw)
        leaf_counts, word_pieces = None, None
        if self._grammar is not None:
            grammar = self._grammar_inputs([lines[i] for i in chunk], rows)
            leaf_counts, word_pieces = grammar["leaf_counts"], grammar.get("word_pieces")
        return put_rows((src, keys, leaf_counts, word_pieces), self.mesh)

    def _grammar_inputs(self, lines: list[str], rows: int) -> dict[str, Any]:
        """What the grammar needs to know of each line: a tree has one leaf per whitespace
        word, and a copying grammar writes each word as the target side tokenizes it."""
        counts = np.zeros(rows, np.int32)
        counts[: len(lines)] = [len(line.split()) for line in lines]
        if not self._grammar.copy_words:
            return {"leaf_counts": counts}
        words = [[self.tokenizer.encode(word) for word in line.split()] for line in lines]
        longest = max(sum(map(len, row)) for row in words)
        width = next((b for b in self.buckets if b >= longest), longest)
        pieces = np.full((rows, width), -1, np.int32)
        starts = np.zeros((rows, width), bool)
        for row, line_words in enumerate(words):
            flat = [piece for word in line_words for piece in word]
            pieces[row, : len(flat)] = flat
            first = np.cumsum([0] + [len(word) for word in line_words[:-1]])
            starts[row, first[[bool(word) for word in line_words]]] = True
        return {"leaf_counts": counts, "word_pieces": (pieces, starts)}

    def _row_keys(self, line_numbers: list[int], rows: int, draw: int = 0) -> np.ndarray | None:
        """Sampling keys: line i's from fold_in(PRNGKey(decode.seed), i), filler rows 0's;
        draw k > 0 of them folds k in once more."""
        if not self.decode_config.sample:
            return None
        numbers = np.zeros(rows, np.uint32)
        numbers[: len(line_numbers)] = line_numbers
        base = jax.random.PRNGKey(self.decode_config.seed)
        keys = jax.vmap(lambda number: jax.random.fold_in(base, number))(numbers)
        if draw:
            keys = jax.vmap(lambda key: jax.random.fold_in(key, draw))(keys)
        return np.asarray(keys)

    def translate_stream(self, lines: TextIO, out: TextIO, chunk_lines: int = 1024) -> int:
        """Reads lines, writes one translation per line (with nbest, `nbest` lines in the
        module docstring's format) flushed per chunk; returns the number of lines read."""
        count = 0
        for chunk in _chunks(lines, chunk_lines):
            if self.nbest:
                for offset, best in enumerate(self.translate_nbest(chunk, first_line=count + 1)):
                    for rank, hypothesis in enumerate(best, start=1):
                        out.write(format_hypothesis(count + 1 + offset, rank, hypothesis) + "\n")
            else:
                for translation in self.translate(chunk, first_line=count + 1):
                    out.write(translation.replace("\n", " ") + "\n")
            out.flush()
            count += len(chunk)
        return count


def _chunks(lines: TextIO, size: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    for line in lines:
        chunk.append(line.rstrip("\n").rstrip("\r"))
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
