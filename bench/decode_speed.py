"""Decoding speed: beam-4 and greedy sentences/s and output tokens/s.

    python bench/decode_speed.py --workdir runs/m30k --json results.json   # (a) and (b)
    python bench/decode_speed.py                                          # (b) only
    python bench/decode_speed.py --smoke

(a) Real: the 1,000 test_2016_flickr source sentences translated by a trained workdir
    through `Translator` (sort by length, bucketed batches of decode.batch_sentences,
    detokenize), exactly as `attnmt translate` does. One untimed pass compiles every
    bucket shape; the timed passes follow. Output tokens are the hypotheses re-encoded
    with the run's vocabulary, plus EOS.
(b) Forced length: random weights of the config's model size (Multi30K by default),
    256 random source sentences of --src-len tokens, every output forced to exactly
    --out-len tokens (EOS included): a wrapper around the model's `tokens_to_logits`
    hides EOS until the last position, where the decoders' own length limit forces it.
    Every sentence therefore costs the same number of decoder steps whatever the weights,
    and so does Hugging Face `generate` on a MarianMTModel of the same size with
    min_new_tokens = max_new_tokens = --out-len, which runs when torch and transformers are
    installed. attnmt keeps its real decode path: key/value caches that start with room for
    decode.initial_cache_length positions and double when full, up to source length +
    decode.max_len_offset (0: that room from the start, with attention over masked slots
    that generate's growing cache does not compute).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import time
from typing import Any

import common
import jax
import jax.numpy as jnp
import numpy as np

from attnmt.common import EOS_ID, PAD_ID
from attnmt.config.model import ModelConfig
from attnmt.decode import beam_search as search
from attnmt.decode.translate import Translator, best_sequences, prepare_search
from attnmt.model.transformer import Transformer

# --------------------------------------------------------------------------- (a) trained run


def real_decode(
    workdir: str, data_dir: str | None, beams: list[int], limit: int, repeats: int
) -> list[dict[str, Any]]:
    from attnmt.data.prepare import load_split
    from attnmt.workdir import load_run

    run = load_run(workdir)
    experiment = run.experiment
    data = dataclasses.replace(experiment.data, data_dir=data_dir or experiment.data.data_dir)
    pairs = load_split(data, data.test_split)
    sources = [src for src, _ in pairs][: limit or None]
    rows = []
    for beam in beams:
        decode = dataclasses.replace(experiment.decode, beam_size=beam)
        translator = Translator([experiment.model], [run.params], run.tokenizer, decode)
        start = time.perf_counter()
        translator.translate(sources)  # compiles every (batch, bucket) shape on the way
        first_pass = time.perf_counter() - start
        seconds, outputs = [], []
        for _ in range(repeats):
            start = time.perf_counter()
            outputs = translator.translate(sources)
            seconds.append(time.perf_counter() - start)
        tokens = sum(len(run.tokenizer.encode(line)) + 1 for line in outputs)
        best = min(seconds)
        rows.append(
            {
                "workload": f"{data.test_split} ({len(sources)}), step {run.step}",
                "impl": "attnmt",
                "dtype": experiment.model.dtype,
                "beam": beam,
                "batch": decode.batch_sentences,
                "first_pass_s": first_pass,
                "seconds": best,
                "sent_per_s": len(sources) / best,
                "tok_per_s": tokens / best,
                "mean_out_len": tokens / len(sources),
            }
        )
        print(f"  real beam={beam}: {rows[-1]['sent_per_s']:.1f} sentences/s", file=sys.stderr)
    return rows


# --------------------------------------------------------------------------- (b) forced length


def force_length(tokens_to_logits: search.TokensToLogits, out_len: int) -> search.TokensToLogits:
    """Wraps a step function so that EOS cannot be chosen before position out_len − 1.

    The wrapper keeps its own step counter as a scalar cache leaf (scalars are shared by
    all rows and never reordered by beam search). With max_lengths = out_len the decoders
    then force EOS at exactly position out_len − 1.
    """

    def wrapped(tokens: jax.Array, cache: tuple[jax.Array, Any]) -> tuple[jax.Array, Any]:
        position, inner = cache
        logits, inner = tokens_to_logits(tokens, inner)
        is_eos = jnp.arange(logits.shape[-1]) == EOS_ID
        # A large finite value, not -inf: at the last position EOS must stay selectable.
        hidden = jnp.where(is_eos & (position < out_len - 1), -1e9, logits.astype(jnp.float32))
        return hidden, (position + 1, inner)

    return wrapped


def forced_decode(
    config: ModelConfig,
    params: Any,
    src_tokens: jax.Array,
    *,
    beam_size: int,
    out_len: int,
    max_len_offset: int,
    initial_cache_length: int,
    alpha: float,
) -> jax.Array:
    """Like decode_batch for one model, with every output exactly `out_len` tokens."""
    batch, src_len = src_tokens.shape
    max_decode_len = src_len + max_len_offset  # the Translator's own length limit
    if max_decode_len < out_len:
        raise ValueError(f"out_len {out_len} exceeds the cache of {max_decode_len} positions")
    step, cache, growth = prepare_search(
        [config],
        [params],
        src_tokens,
        rows=beam_size,
        max_decode_len=max_decode_len,
        initial_cache_length=initial_cache_length,
    )
    cache = (jnp.zeros((), jnp.int32), cache)
    tokens_to_logits = force_length(step, out_len)
    return best_sequences(
        tokens_to_logits,
        cache,
        growth,
        beam_size=beam_size,
        alpha=alpha,
        max_lengths=jnp.full((batch,), out_len, jnp.int32),
        max_decode_len=max_decode_len,
        bos_id=config.decoder_start_id,  # as decode_batch starts the decoder
    )


def random_sources(n: int, src_len: int, vocab: int, seed: int = 0) -> np.ndarray:
    """[n, src_len] random tokens, every row full and ending in EOS."""
    batch = common.random_batch(np.random.default_rng(seed), n, src_len, vocab, fill=1.0)
    return batch["src_tokens"]


def random_params(config: ModelConfig, seed: int = 0) -> Any:
    import flax.linen as nn

    tokens = jnp.zeros((1, 8), jnp.int32)
    variables = jax.jit(Transformer(config).init)(jax.random.PRNGKey(seed), tokens, tokens)
    return nn.meta.unbox(variables["params"])


def _chunks(array: np.ndarray, size: int) -> list[np.ndarray]:
    return [array[i : i + size] for i in range(0, len(array), size)]


def attnmt_forced(
    config: ModelConfig,
    params: Any,
    sources: np.ndarray,
    *,
    beam: int,
    batch: int,
    out_len: int,
    max_len_offset: int,
    initial_cache_length: int,
    alpha: float,
    repeats: int,
) -> dict[str, Any]:
    decode = jax.jit(
        functools.partial(
            forced_decode,
            config,
            beam_size=beam,
            out_len=out_len,
            max_len_offset=max_len_offset,
            initial_cache_length=initial_cache_length,
            alpha=alpha,
        )
    )
    chunks = [jax.device_put(c) for c in _chunks(sources, batch)]
    if len(chunks[-1]) != batch:
        raise ValueError(f"{len(sources)} sentences do not split into batches of {batch}")
    start = time.perf_counter()
    outputs = common.block(decode(params, chunks[0]))
    compile_s = time.perf_counter() - start
    lengths = np.asarray((outputs != PAD_ID).sum(axis=1))
    if not np.all(lengths == out_len):
        raise AssertionError(f"forced decoding produced lengths {sorted(set(lengths.tolist()))}")
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        common.block([decode(params, chunk) for chunk in chunks])
        seconds.append(time.perf_counter() - start)
    return _forced_row(
        "attnmt", config.dtype, beam, batch, len(sources), out_len, compile_s, seconds
    )


def _forced_row(
    impl: str,
    dtype: str,
    beam: int,
    batch: int,
    n: int,
    out_len: int,
    first_s: float,
    seconds: list[float],
) -> dict[str, Any]:
    best = min(seconds)
    return {
        "workload": f"forced {n}x{out_len}",
        "impl": impl,
        "dtype": dtype,
        "beam": beam,
        "batch": batch,
        "first_pass_s": first_s,
        "seconds": best,
        "sent_per_s": n / best,
        "tok_per_s": n * out_len / best,
        "mean_out_len": float(out_len),
    }


def hf_forced(
    config: ModelConfig,
    sources: np.ndarray,
    *,
    beam: int,
    batch: int,
    out_len: int,
    alpha: float,
    repeats: int,
) -> dict[str, Any]:
    """MarianMTModel.generate on the same sources, min = max new tokens = out_len."""
    import peer_marian
    import torch

    model = peer_marian.build_marian(config, max(512, sources.shape[1] + out_len + 2))
    model.eval()
    bf16 = config.dtype == "bfloat16"
    chunks = [torch.from_numpy(c.astype(np.int64)) for c in _chunks(sources, batch)]

    # length_penalty means something only to beam search; generate() warns otherwise.
    penalty = {"length_penalty": alpha} if beam > 1 else {}

    def generate(src: Any) -> Any:
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            return model.generate(
                input_ids=src,
                attention_mask=(src != PAD_ID).long(),
                num_beams=beam,
                do_sample=False,
                min_new_tokens=out_len,
                max_new_tokens=out_len,
                use_cache=True,
                **penalty,
            )

    start = time.perf_counter()
    out = generate(chunks[0])
    first_s = time.perf_counter() - start
    # generate() returns the decoder start token followed by the new tokens.
    if out.shape[1] != out_len + 1:
        raise AssertionError(f"generate returned {out.shape[1] - 1} new tokens, not {out_len}")
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        for chunk in chunks:
            generate(chunk)
        seconds.append(time.perf_counter() - start)
    return _forced_row(
        "hf generate", config.dtype, beam, batch, len(sources), out_len, first_s, seconds
    )


def forced_rows(
    config: ModelConfig,
    *,
    sentences: int,
    src_len: int,
    out_len: int,
    batch: int,
    beams: list[int],
    max_len_offset: int,
    initial_cache_length: int,
    alpha: float,
    repeats: int,
    peer: bool,
) -> list[dict[str, Any]]:
    """The forced-length workload for attnmt (and generate when `peer`), every beam size."""
    sources = random_sources(sentences, src_len, config.vocab_size)
    params = random_params(config)
    rows = []
    for beam in beams:
        rows.append(
            attnmt_forced(
                config,
                params,
                sources,
                beam=beam,
                batch=batch,
                out_len=out_len,
                max_len_offset=max_len_offset,
                initial_cache_length=initial_cache_length,
                alpha=alpha,
                repeats=repeats,
            )
        )
        print(f"  forced attnmt beam={beam}: {rows[-1]['sent_per_s']:.1f} sent/s", file=sys.stderr)
        if peer:
            rows.append(
                hf_forced(
                    config,
                    sources,
                    beam=beam,
                    batch=batch,
                    out_len=out_len,
                    alpha=alpha,
                    repeats=repeats,
                )
            )
            print(f"  forced generate beam={beam}: {rows[-1]['sent_per_s']:.1f}", file=sys.stderr)
    return rows


COLUMNS = [
    "workload",
    "impl",
    "dtype",
    "beam",
    "batch",
    "first_pass_s",
    "seconds",
    "sent_per_s",
    "tok_per_s",
    "mean_out_len",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", help="a trained run for (a); without it only (b) runs")
    parser.add_argument("--data-dir", help="Multi30K folder for (a) (default: the run's / shared)")
    parser.add_argument("--limit", type=int, default=0, help="(a): first N test sentences only")
    parser.add_argument("--beams", type=common.int_list, default=[4, 1])
    parser.add_argument("--repeats", type=int, default=2, help="timed passes (best is kept)")
    parser.add_argument("--config", default="multi30k", help="(b): model size")
    parser.add_argument("--dtypes", type=common.str_list, default=["float32"], help="(b)")
    parser.add_argument("--sentences", type=int, default=256, help="(b)")
    parser.add_argument("--src-len", type=int, default=24, help="(b): tokens incl. EOS")
    parser.add_argument("--out-len", type=int, default=30, help="(b): tokens incl. EOS")
    parser.add_argument("--batch", type=int, help="(b): default decode.batch_sentences")
    parser.add_argument("--no-peer", action="store_true", help="(b): skip HF generate")
    parser.add_argument("--skip-forced", action="store_true", help="(a) only")
    parser.add_argument(
        "--override", action="append", default=[], help="(b): model.num_layers=2 (repeatable)"
    )
    common.add_output_args(parser)
    args = parser.parse_args()
    if args.smoke:
        args.limit, args.repeats, args.sentences, args.batch = 16, 1, 8, 8
        args.src_len, args.out_len = 8, 6
        args.override = [*args.override, "model.num_layers=1"]

    info = common.machine_info()
    common.print_machine(info)
    common.warn_if_busy(info)
    rows: list[dict[str, Any]] = []
    if args.workdir:
        data_dir = args.data_dir or common.default_multi30k_dir()
        rows += real_decode(args.workdir, data_dir, args.beams, args.limit, args.repeats)
    if not args.skip_forced:
        peer = False
        if not args.no_peer:
            import peer_marian

            peer = peer_marian.import_peer() is not None
        experiment = common.load_experiment(args.config, tuple(args.override))
        for dtype in args.dtypes:
            config = dataclasses.replace(experiment.model, dtype=dtype)
            rows += forced_rows(
                config,
                sentences=args.sentences,
                src_len=args.src_len,
                out_len=args.out_len,
                batch=args.batch or experiment.decode.batch_sentences,
                beams=args.beams,
                max_len_offset=experiment.decode.max_len_offset,
                initial_cache_length=experiment.decode.initial_cache_length,
                alpha=experiment.decode.alpha,
                repeats=args.repeats,
                peer=peer,
            )
    print(common.markdown_table(rows, COLUMNS))
    common.append_json(args.json, "decode_speed", args, rows)


if __name__ == "__main__":
    main()
