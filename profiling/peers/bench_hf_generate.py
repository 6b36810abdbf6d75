"""Hugging Face ``model.generate`` decoding the toy Qwen3 (run in the torch venv).

    /tmp/peers/venv-torch/bin/python profiling/peers/bench_hf_generate.py
    ANCHOR_BATCH (16) ANCHOR_PROMPT_LEN (32) ANCHOR_NEW_TOKENS (64) ANCHOR_REPEATS (5)
    ANCHOR_SAMPLING=greedy|top_p (greedy)  ANCHOR_CACHE=dynamic|static (dynamic)

The model is ``transformers.Qwen3ForCausalLM`` built from a ``Qwen3Config`` at
``toy_common.MODEL_DIMS`` with a random init; nothing is downloaded. Special ids are
suppressed and ``min_new_tokens`` is set, so every completion is exactly
ANCHOR_NEW_TOKENS long. One untimed call warms up; the figure is the median of the
timed calls. Prints a JSON line, then a ``RESULT`` line.
"""

from __future__ import annotations

import json
import os
import time

import torch
import toy_common as tc
import transformers
from transformers import Qwen3Config, Qwen3ForCausalLM


def build_model(d: dict = tc.MODEL_DIMS, seed: int = 0) -> Qwen3ForCausalLM:
    """transformers' Qwen3 at the toy dims (also used by the TRL and RL scripts)."""
    cfg = Qwen3Config(
        vocab_size=d["vocab_size"],
        hidden_size=d["d_model"],
        intermediate_size=d["ffn_dim"],
        num_hidden_layers=d["num_layers"],
        num_attention_heads=d["num_heads"],
        num_key_value_heads=d["num_kv_heads"],
        head_dim=d["head_dim"],
        rms_norm_eps=d["norm_eps"],
        rope_parameters={"rope_type": "default", "rope_theta": float(d["rope_theta"])},
        tie_word_embeddings=d["tied_embedding"],
        max_position_embeddings=4096,
        bos_token_id=tc.BOS_ID,
        eos_token_id=tc.EOS_ID,
        pad_token_id=tc.PAD_ID,
    )
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(cfg).to(torch.float32).eval()


def generate_kwargs(new_tokens: int, sampled: bool) -> dict:
    """Exactly ``new_tokens`` per row: special ids suppressed, no early end."""
    kw = {
        "max_new_tokens": new_tokens,
        "min_new_tokens": new_tokens,
        "suppress_tokens": tc.SPECIAL_IDS,
        "pad_token_id": tc.PAD_ID,
        "eos_token_id": tc.EOS_ID,
    }
    if sampled:
        kw.update(do_sample=True, temperature=1.0, top_p=1.0, top_k=0)
    else:
        kw.update(do_sample=False)
    return kw


def main() -> None:
    d = tc.MODEL_DIMS
    mode = os.environ.get("ANCHOR_SAMPLING", "greedy")
    cache = os.environ.get("ANCHOR_CACHE", "dynamic")
    model = build_model(d)
    n_params = sum(p.numel() for p in model.parameters())
    tok = tc.build_tokenizer(d["vocab_size"])
    rows = [[tc.BOS_ID, *tok.encode(p)] for p in tc.make_prompts(tc.BATCH, tc.PROMPT_LEN)]
    if any(len(r) != tc.PROMPT_LEN for r in rows):
        raise SystemExit("a prompt does not have ANCHOR_PROMPT_LEN tokens")
    input_ids = torch.tensor(rows, dtype=torch.long)
    mask = torch.ones_like(input_ids)
    kw = generate_kwargs(tc.NEW_TOKENS, mode == "top_p")
    if cache != "dynamic":
        kw["cache_implementation"] = cache

    def call(seed: int) -> tuple[float, int, torch.Tensor]:
        torch.manual_seed(seed)
        t = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(input_ids=input_ids, attention_mask=mask, **kw)
        new = out[:, tc.PROMPT_LEN :]
        return time.perf_counter() - t, new.numel(), new

    first_s, new, times, tps = tc.timed_calls(call)  # warm-up
    res = {
        "bench": "hf_generate",
        "sampling": mode,
        "cache": cache,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "dims": d,
        "n_params": int(n_params),
        "attn_impl": model.config._attn_implementation,
        "batch": tc.BATCH,
        "prompt_len": tc.PROMPT_LEN,
        "new_tokens": tc.NEW_TOKENS,
        "first_call_s": round(first_s, 3),
        "gen_s": tc.summarize(times),
        "tokens_per_s_median": round(sorted(tps)[len(tps) // 2], 1),
        "tokens_per_s_runs": [round(x, 1) for x in tps],
        "sample_text": tok.decode(new[0][:10].tolist()),
    }
    tc.print_threads("torch")
    print(json.dumps(res))
    print(
        f"RESULT hf_generate[{mode},{cache}] B={tc.BATCH} P={tc.PROMPT_LEN} "
        f"N={tc.NEW_TOKENS}: {res['tokens_per_s_median']} gen tok/s (median of "
        f"{tc.REPEATS}; runs {res['tokens_per_s_runs']}), first call "
        f"{res['first_call_s']}s, params={n_params}"
    )


if __name__ == "__main__":
    main()
