"""Tunix's ``Sampler`` on the multi-turn RL workload, as its users drive it (JAX + Tunix venv).

    /tmp/peers/venv/bin/python profiling/peers/bench_tunix_rl.py
    RL_ROUNDS (2 timed rounds after one untimed) and the workload's RL_* (toy_common)

One round is one rollout step of ``toy_common.RLWorkload`` (8 tasks x G=8 episodes,
3 turns of 64 tokens, 32-token observations between turns): every turn the whole
conversation so far, as text, goes back to the sampler for all episodes in one batch
(the sampler keeps nothing between calls), and the sampled text plus the observation
is appended to it. ``max_prompt_length`` is each turn's exact prompt length (no
padding, one compile per turn shape, done in the untimed round); the cache is sized
for the longest turn, as one ``Sampler`` serving the whole episode must be.
Temperature 1, special ids forbidden, so every turn is exactly 64 tokens.

Prints a JSON line, then ``RESULT tunix_rl ...: <gen tok/s> gen tok/s, prefill tokens
<n>, kv bytes <n>``. Prefill tokens are the prompt positions the sampler ran (its
padded prompts); KV bytes are those of the cache it allocates per call, measured on
the arrays its model's ``init_cache`` returns.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import toy_common as tc
import tunix
from bench_tunix_sampler import build_model, make_sampler

ROUNDS = int(os.environ.get("RL_ROUNDS", 2))


def rollout_step(sampler, w: tc.RLWorkload, seed: int) -> dict:
    """All episodes of one step, turn by turn; seconds, tokens generated and prefilled."""
    t = time.perf_counter()
    # Text without BOS: the sampler's tokenize adds it.
    texts = [tc.words(p[1:]) for p in w.first_prompts(seed)]
    generated = prefilled = 0
    for turn, length in enumerate(w.prompt_lengths()):
        out = sampler(
            texts,
            max_generation_steps=w.new_tokens,
            max_prompt_length=length,
            forbidden_tokens=tc.SPECIAL_IDS,
            temperature=1.0,
            top_p=1.0,
            top_k=None,
            seed=seed * 1000 + turn,
        )
        padded = np.asarray(out.padded_prompt_tokens)
        if padded.shape != (w.episodes, length) or (padded == tc.PAD_ID).any():
            raise SystemExit(f"turn {turn}: prompts are not {length} tokens each")
        prefilled += padded.size
        for e, answer in enumerate(out.text):
            if len(out.tokens[e]) != w.new_tokens:
                raise SystemExit(f"turn {turn}: episode {e} got {len(out.tokens[e])} tokens")
            generated += len(out.tokens[e])
            texts[e] += " " + answer
            if turn < w.turns - 1:
                texts[e] += " " + tc.words(w.observation(seed, e, turn))
    return {"s": time.perf_counter() - t, "generated": generated, "prefilled": prefilled}


def main() -> None:
    w = tc.rl_workload_from_env()
    model = build_model()
    sampler = make_sampler(model, w.final_length)
    cache = model.init_cache(w.episodes, w.final_length, jnp.float32)
    kv_bytes = sum(x.nbytes for x in jax.tree.leaves(cache) if x.ndim >= 4)
    del cache
    first = rollout_step(sampler, w, seed=0)  # compiles each turn's prefill and the decode
    rounds = [rollout_step(sampler, w, seed=r + 1) for r in range(ROUNDS)]
    if any(r["generated"] != w.generated_tokens for r in rounds):
        raise SystemExit("a round generated fewer tokens than the workload states")
    med = statistics.median(r["s"] for r in rounds)
    res = {
        "bench": "tunix_rl",
        "tunix": tunix.__version__,
        "jax": jax.__version__,
        "device": str(jax.devices()[0]),
        "workload": vars(w),
        "prompt_lengths": w.prompt_lengths(),
        "cache_size": w.final_length,
        "first_round_s": round(first["s"], 3),
        "round_s": [round(r["s"], 3) for r in rounds],
        "gen_tok_per_s": round(w.generated_tokens / med, 1),
        "prefill_tokens": rounds[0]["prefilled"],
        "kv_bytes": int(kv_bytes),
    }
    tc.print_threads("jax")
    print(json.dumps(res))
    print(
        f"RESULT tunix_rl {w.tasks}x{w.group} turns={w.turns}: {res['gen_tok_per_s']} gen tok/s "
        f"(median of {ROUNDS} rounds, {res['round_s']} s), prefill tokens "
        f"{res['prefill_tokens']}, kv bytes {res['kv_bytes']}, first round {res['first_round_s']}s"
    )


if __name__ == "__main__":
    main()
