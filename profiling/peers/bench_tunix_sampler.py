"""Tunix's vanilla ``Sampler`` decoding the toy Qwen3 (run in the JAX + Tunix venv).

    /tmp/peers/venv/bin/python profiling/peers/bench_tunix_sampler.py
    ANCHOR_BATCH (16) ANCHOR_PROMPT_LEN (32) ANCHOR_NEW_TOKENS (64) ANCHOR_REPEATS (5)
    ANCHOR_SAMPLING=greedy|top_p (greedy; top_p is temperature 1, top_p 1.0)

The model is ``tunix.models.qwen3.model.Qwen3`` at ``toy_common.MODEL_DIMS`` with a
random init; nothing is downloaded. Special ids are forbidden, so every completion
is exactly ANCHOR_NEW_TOKENS long. One untimed call compiles; the figure is the
median of the timed calls. Prints a JSON line, then a ``RESULT`` line.
"""

from __future__ import annotations

import json
import os
import time

import toy_common as tc

_t = time.perf_counter()
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import tunix  # noqa: E402
from flax import nnx  # noqa: E402
from tunix.generate import sampler as sampler_lib  # noqa: E402
from tunix.models.qwen3 import model as qwen3_lib  # noqa: E402

IMPORT_S = time.perf_counter() - _t


def build_model(seed: int = 0, d: dict = tc.MODEL_DIMS):
    """Tunix's own Qwen3 class at the toy dims (also used by the GRPO and RL scripts)."""
    cfg = qwen3_lib.ModelConfig(
        num_layers=d["num_layers"],
        vocab_size=d["vocab_size"],
        embed_dim=d["d_model"],
        hidden_dim=d["ffn_dim"],
        num_heads=d["num_heads"],
        head_dim=d["head_dim"],
        num_kv_heads=d["num_kv_heads"],
        rope_theta=d["rope_theta"],
        norm_eps=d["norm_eps"],
        use_tied_embedding=d["tied_embedding"],
        dtype=jnp.float32,
        param_dtype=jnp.float32,
    )
    return qwen3_lib.Qwen3(cfg, rngs=nnx.Rngs(params=seed))


def make_sampler(model, cache_size: int, d: dict = tc.MODEL_DIMS):
    return sampler_lib.Sampler(
        transformer=model,
        tokenizer=tc.build_tokenizer(d["vocab_size"]),
        cache_config=sampler_lib.CacheConfig(
            cache_size=cache_size,
            num_layers=d["num_layers"],
            num_kv_heads=d["num_kv_heads"],
            head_dim=d["head_dim"],
        ),
    )


def main() -> None:
    d = tc.MODEL_DIMS
    mode = os.environ.get("ANCHOR_SAMPLING", "greedy")
    t = time.perf_counter()
    model = build_model()
    n_params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    init_s = time.perf_counter() - t
    cache_size = tc.PROMPT_LEN + tc.NEW_TOKENS
    sampler = make_sampler(model, cache_size)
    prompts = tc.make_prompts(tc.BATCH, tc.PROMPT_LEN, d["vocab_size"])
    kwargs = {
        "max_generation_steps": tc.NEW_TOKENS,
        "max_prompt_length": tc.PROMPT_LEN,
        "forbidden_tokens": tc.SPECIAL_IDS,  # no early end: every row has the same length
        "echo": False,
    }
    if mode == "top_p":
        kwargs.update(temperature=1.0, top_p=1.0, top_k=None)

    def call(seed: int) -> tuple[float, int, object]:
        t = time.perf_counter()
        out = sampler(prompts, seed=seed, **kwargs)
        jax.block_until_ready(out.tokens)
        return time.perf_counter() - t, sum(len(x) for x in out.tokens), out

    first_s, out, times, tps = tc.timed_calls(call)  # compiles prefill and decode
    if out.padded_prompt_tokens.shape != (tc.BATCH, tc.PROMPT_LEN):
        raise SystemExit(f"unexpected prompt shape {out.padded_prompt_tokens.shape}")
    median_tps = sorted(tps)[len(tps) // 2]
    gen = tc.summarize(times)
    res = {
        "bench": "tunix_sampler",
        "sampling": mode,
        "tunix": tunix.__version__,
        "jax": jax.__version__,
        "device": str(jax.devices()[0]),
        "dims": d,
        "n_params": int(n_params),
        "batch": tc.BATCH,
        "prompt_len": tc.PROMPT_LEN,
        "new_tokens": tc.NEW_TOKENS,
        "cache_size": cache_size,
        "import_s": round(IMPORT_S, 2),
        "init_s": round(init_s, 2),
        "first_call_s": round(first_s, 3),
        "compile_s_est": round(first_s - gen["median"], 3),
        "gen_s": gen,
        "tokens_per_s_median": round(median_tps, 1),
        "tokens_per_s_runs": [round(x, 1) for x in tps],
    }
    tc.print_threads("jax")
    print(json.dumps(res))
    print(
        f"RESULT tunix_sampler[{mode}] B={tc.BATCH} P={tc.PROMPT_LEN} N={tc.NEW_TOKENS}: "
        f"{res['tokens_per_s_median']} gen tok/s (median of {tc.REPEATS}; runs "
        f"{res['tokens_per_s_runs']}), first call {res['first_call_s']}s, "
        f"compile~{res['compile_s_est']}s, params={n_params}"
    )


if __name__ == "__main__":
    main()
