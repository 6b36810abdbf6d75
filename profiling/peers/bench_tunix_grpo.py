"""Tunix's ``GRPOLearner`` training the toy Qwen3 (run in the JAX + Tunix venv).

    /tmp/peers/venv/bin/python profiling/peers/bench_tunix_grpo.py
    ANCHOR_GRPO_PROMPTS (4 prompts a step) ANCHOR_GRPO_G (4 samples a prompt)
    ANCHOR_PROMPT_LEN (32, BOS included) ANCHOR_NEW_TOKENS (64)
    ANCHOR_GRPO_STEPS (8; step 1 compiles and is left out) ANCHOR_GRPO_BETA (0.04)

The workload of ``bench_trl_grpo.py``: a step is 4 prompts x 4 samples = 16
completions of exactly 64 tokens at temperature 1 / top_p 1, a reference model (a
second copy of the random init) with KL weight 0.04, one iteration, AdamW 1e-5,
Tunix's vanilla rollout (its ``Sampler``); the reward is the fraction of completion
words with an even id.

``RolloutConfig`` has no way to forbid tokens, so this script wraps
``Sampler.__call__`` to forbid the special ids: that is what makes every
completion full length, as ``suppress_tokens`` + ``min_new_tokens`` do on TRL's
side. The wrap lives in this script only.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import time

import grain
import jax
import optax
import toy_common as tc
import tunix
from bench_tunix_sampler import build_model
from tunix.generate import sampler as sampler_lib
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.grpo import grpo_learner as grpo_lib
from tunix.rl.rollout import base_rollout

N_PROMPTS = int(os.environ.get("ANCHOR_GRPO_PROMPTS", 4))
G = int(os.environ.get("ANCHOR_GRPO_G", 4))
STEPS = int(os.environ.get("ANCHOR_GRPO_STEPS", 8))
BETA = float(os.environ.get("ANCHOR_GRPO_BETA", 0.04))

_sampler_call = sampler_lib.Sampler.__call__


@functools.wraps(_sampler_call)
def _call_without_special_ids(self, *args, **kwargs):
    if kwargs.get("forbidden_tokens") is None:
        kwargs["forbidden_tokens"] = tc.SPECIAL_IDS
    return _sampler_call(self, *args, **kwargs)


sampler_lib.Sampler.__call__ = _call_without_special_ids


def even_word_reward(prompts, completions, **kwargs) -> list[float]:
    return tc.even_word_fraction(completions)


def training_metrics(cluster) -> dict:
    """Tunix's own per-step metrics (lengths, scores, loss, KL): a check that work was done."""
    out = {}
    for logger in (cluster._rl_metrics_logger, cluster.actor_trainer.metrics_logger):
        for prefix, modes in logger._metrics.items():
            train = [v for m, v in modes.items() if "train" in str(m).lower()]
            for name, values in (train[0] if train else {}).items():
                keep = ("mean_length", "min_length", "score/mean", "loss", "kl")
                if any(k in name for k in keep):
                    out[f"{prefix}/{name}"] = [round(float(v), 6) for v in values]
    return out


def main() -> None:
    d = tc.MODEL_DIMS
    # Auto axes: with JAX's default Explicit axes Qwen3's embedding gather fails to shard.
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    with jax.set_mesh(mesh):
        actor, reference = build_model(0), build_model(0)
    tok = tc.build_tokenizer(d["vocab_size"])
    texts = tc.make_prompts(N_PROMPTS * (STEPS + 1), tc.PROMPT_LEN, d["vocab_size"], seed=1)
    # The numpy batch goes in as it is: list() on it makes Tunix's repeat hand arrays
    # to the tokenizer.
    dataset = (
        grain.MapDataset.source(["<s> " + t for t in texts])
        .batch(N_PROMPTS)
        .map(lambda x: {"prompts": x})
    )
    cluster_config = rl_cluster_lib.ClusterConfig(
        role_to_mesh={
            rl_cluster_lib.Role.ACTOR: mesh,
            rl_cluster_lib.Role.REFERENCE: mesh,
            rl_cluster_lib.Role.ROLLOUT: mesh,
        },
        rollout_engine="vanilla",
        offload_to_cpu=False,
        training_config=rl_cluster_lib.RLTrainingConfig(
            actor_optimizer=optax.adamw(1e-5),
            eval_every_n_steps=10_000,
            max_steps=STEPS,
            checkpoint_root_directory=None,
        ),
        rollout_config=base_rollout.RolloutConfig(
            max_tokens_to_generate=tc.NEW_TOKENS,
            max_prompt_length=tc.PROMPT_LEN,
            kv_cache_size=tc.PROMPT_LEN + tc.NEW_TOKENS,
            temperature=1.0,
            top_p=1.0,
            top_k=None,
        ),
    )
    t = time.perf_counter()
    cluster = rl_cluster_lib.RLCluster(
        actor=actor, reference=reference, tokenizer=tok, cluster_config=cluster_config
    )
    cluster.with_external_metrics_logger(lambda *a, **k: None)
    learner = grpo_lib.GRPOLearner(
        rl_cluster=cluster,
        reward_fns=even_word_reward,
        algo_config=grpo_lib.GRPOConfig(
            num_generations=G, num_iterations=1, beta=BETA, epsilon=0.2
        ),
    )
    setup_s = time.perf_counter() - t

    step_s: list[float] = []
    run_step = learner._run_global_step

    def timed_step(*args, **kwargs):
        t = time.perf_counter()
        out = run_step(*args, **kwargs)
        jax.effects_barrier()
        step_s.append(time.perf_counter() - t)
        return out

    learner._run_global_step = timed_step
    t = time.perf_counter()
    learner.train(dataset)
    train_s = time.perf_counter() - t

    med = statistics.median(step_s[1:])
    completions = N_PROMPTS * G
    res = {
        "bench": "tunix_grpo",
        "tunix": tunix.__version__,
        "jax": jax.__version__,
        "device": str(jax.devices()[0]),
        "dims": d,
        "prompts_per_step": N_PROMPTS,
        "num_generations": G,
        "prompt_len": tc.PROMPT_LEN,
        "completion_len": tc.NEW_TOKENS,
        "beta": BETA,
        "steps": len(step_s),
        "setup_s": round(setup_s, 2),
        "train_wall_s": round(train_s, 2),
        "step_s_all": [round(x, 3) for x in step_s],
        "step_s_median_excl_first": round(med, 3),
        "completion_tok_per_s": round(completions * tc.NEW_TOKENS / med, 1),
        "total_tok_per_s": round(completions * (tc.PROMPT_LEN + tc.NEW_TOKENS) / med, 1),
        "actor_train_steps": cluster.actor_trainer.train_steps,
        "metrics": training_metrics(cluster),
    }
    tc.print_threads("jax")
    print(json.dumps(res))
    print(
        f"RESULT tunix_grpo {N_PROMPTS}x{G} P={tc.PROMPT_LEN} C={tc.NEW_TOKENS} beta={BETA}: "
        f"{res['step_s_median_excl_first']} s/step (median of steps 2..{len(step_s)}), "
        f"{res['completion_tok_per_s']} completion tok/s, first step (compile) "
        f"{res['step_s_all'][0]}s"
    )


if __name__ == "__main__":
    main()
