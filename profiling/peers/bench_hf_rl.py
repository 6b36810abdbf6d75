"""Hugging Face ``generate`` on the multi-turn RL workload, as its users drive it (torch venv).

    /tmp/peers/venv-torch/bin/python profiling/peers/bench_hf_rl.py
    RL_ROUNDS (2 timed rounds after one untimed) and the workload's RL_* (toy_common)

One round is one rollout step of ``toy_common.RLWorkload`` (8 tasks x G=8 episodes,
3 turns of 64 tokens, 32-token observations between turns): every turn the whole
conversation so far, as token ids, goes to ``generate`` for all episodes in one batch
(a fresh ``DynamicCache`` each call), and the new tokens plus the observation are
appended. Sampled at temperature 1, special ids suppressed and ``min_new_tokens``
set, so every turn is exactly 64 tokens.

Prints a JSON line, then ``RESULT hf_rl ...: <gen tok/s> gen tok/s, prefill tokens <n>,
kv bytes <n>``. Prefill tokens are the prompt tokens sent each turn; KV bytes are
the largest cache ``generate`` returned (the last turn's), summed over its tensors.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import torch
import toy_common as tc
import transformers
from bench_hf_generate import build_model, generate_kwargs

ROUNDS = int(os.environ.get("RL_ROUNDS", 2))


def cache_bytes(cache) -> int:
    """Bytes of the key and value tensors a ``generate`` call left in its cache."""
    layers = getattr(cache, "layers", None)
    if layers is not None:  # transformers 5: one object per layer
        pairs = [(layer.keys, layer.values) for layer in layers]
    else:  # older caches iterate as (key, value) per layer
        pairs = list(cache)
    return sum(t.numel() * t.element_size() for pair in pairs for t in pair if t is not None)


def rollout_step(model, w: tc.RLWorkload, seed: int) -> dict:
    """All episodes of one step, turn by turn; seconds, tokens generated and prefilled, KV."""
    torch.manual_seed(seed)
    kw = generate_kwargs(w.new_tokens, sampled=True)
    t = time.perf_counter()
    ids = torch.tensor(w.first_prompts(seed), dtype=torch.long)
    generated = prefilled = kv = 0
    for turn, length in enumerate(w.prompt_lengths()):
        if ids.shape != (w.episodes, length):
            raise SystemExit(f"turn {turn}: prompts are {tuple(ids.shape)}, not {length} each")
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                return_dict_in_generate=True,
                **kw,
            )
        prefilled += ids.numel()
        kv = max(kv, cache_bytes(out.past_key_values))
        new = out.sequences[:, length:]
        if new.shape[1] != w.new_tokens:
            raise SystemExit(f"turn {turn}: {new.shape[1]} tokens generated, not {w.new_tokens}")
        generated += new.numel()
        ids = out.sequences
        if turn < w.turns - 1:
            obs = [w.observation(seed, e, turn) for e in range(w.episodes)]
            ids = torch.cat([ids, torch.tensor(obs, dtype=torch.long)], dim=1)
    return {"s": time.perf_counter() - t, "generated": generated, "prefilled": prefilled, "kv": kv}


def main() -> None:
    w = tc.rl_workload_from_env()
    model = build_model()
    first = rollout_step(model, w, seed=0)  # warm-up
    rounds = [rollout_step(model, w, seed=r + 1) for r in range(ROUNDS)]
    if any(r["generated"] != w.generated_tokens for r in rounds):
        raise SystemExit("a round generated fewer tokens than the workload states")
    med = statistics.median(r["s"] for r in rounds)
    res = {
        "bench": "hf_rl",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "attn_impl": model.config._attn_implementation,
        "workload": vars(w),
        "prompt_lengths": w.prompt_lengths(),
        "first_round_s": round(first["s"], 3),
        "round_s": [round(r["s"], 3) for r in rounds],
        "gen_tok_per_s": round(w.generated_tokens / med, 1),
        "prefill_tokens": rounds[0]["prefilled"],
        "kv_bytes": max(r["kv"] for r in rounds),
    }
    tc.print_threads("torch")
    print(json.dumps(res))
    print(
        f"RESULT hf_rl {w.tasks}x{w.group} turns={w.turns}: {res['gen_tok_per_s']} gen tok/s "
        f"(median of {ROUNDS} rounds, {res['round_s']} s), prefill tokens "
        f"{res['prefill_tokens']}, kv bytes {res['kv_bytes']}, first round {res['first_round_s']}s"
    )


if __name__ == "__main__":
    main()
