"""TRL's ``GRPOTrainer`` training the toy Qwen3 (run in the torch venv).

    /tmp/peers/venv-torch/bin/python profiling/peers/bench_trl_grpo.py
    ANCHOR_GRPO_PROMPTS (4 prompts a step) ANCHOR_GRPO_G (4 samples a prompt)
    ANCHOR_PROMPT_LEN (32, BOS included) ANCHOR_NEW_TOKENS (64)
    ANCHOR_GRPO_STEPS (8; step 1 warms up and is left out) ANCHOR_GRPO_BETA (0.04)

The workload of ``bench_tunix_grpo.py``: a step is 4 prompts x 4 samples = 16
completions of exactly 64 tokens (special ids suppressed, ``min_new_tokens``) at
temperature 1, a reference model with KL weight 0.04, one iteration, AdamW 1e-5;
the reward is the fraction of completion words with an even id. With ``beta > 0``
TRL builds the reference model from the policy's path, so the random model is saved
under ``$PEERS_WORKDIR/tiny-qwen3-hf`` (default /tmp/peers) and loaded from there.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import torch
import toy_common as tc
import transformers
import trl
from bench_hf_generate import build_model
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

WORK = os.environ.get("PEERS_WORKDIR", "/tmp/peers")
N_PROMPTS = int(os.environ.get("ANCHOR_GRPO_PROMPTS", 4))
G = int(os.environ.get("ANCHOR_GRPO_G", 4))
STEPS = int(os.environ.get("ANCHOR_GRPO_STEPS", 8))
BETA = float(os.environ.get("ANCHOR_GRPO_BETA", 0.04))


def even_word_reward(completions, **kwargs) -> list[float]:
    return tc.even_word_fraction(completions)


class StepTimer(TrainerCallback):
    """Wall seconds of every optimizer step."""

    def __init__(self):
        self.times: list[float] = []
        self._start = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self._start)


def main() -> None:
    d = tc.MODEL_DIMS
    model_dir = os.path.join(WORK, "tiny-qwen3-hf")
    tok = tc.build_tokenizer(d["vocab_size"])
    build_model(d).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)

    texts = tc.make_prompts(N_PROMPTS * STEPS, tc.PROMPT_LEN, d["vocab_size"], seed=1)
    prompts = ["<s> " + t for t in texts]
    if len(tok(prompts[0], add_special_tokens=False)["input_ids"]) != tc.PROMPT_LEN:
        raise SystemExit("a prompt does not have ANCHOR_PROMPT_LEN tokens")
    args = GRPOConfig(
        output_dir=os.path.join(WORK, "trl_out"),
        use_cpu=True,
        bf16=False,
        fp16=False,
        per_device_train_batch_size=N_PROMPTS * G,
        num_generations=G,
        gradient_accumulation_steps=1,
        max_completion_length=tc.NEW_TOKENS,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=BETA,
        num_iterations=1,
        learning_rate=1e-5,
        max_steps=STEPS,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=0,
        shuffle_dataset=False,
        dataloader_num_workers=0,
        disable_dropout=True,
        log_completions=False,
        generation_kwargs={"suppress_tokens": tc.SPECIAL_IDS, "min_new_tokens": tc.NEW_TOKENS},
    )
    timer = StepTimer()
    t = time.perf_counter()
    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=even_word_reward,
        args=args,
        train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
        processing_class=tok,
        callbacks=[timer],
    )
    setup_s = time.perf_counter() - t
    t = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t

    logs = [h for h in trainer.state.log_history if "loss" in h]
    med = statistics.median(timer.times[1:])
    completions = N_PROMPTS * G
    res = {
        "bench": "trl_grpo",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "threads": torch.get_num_threads(),
        "dims": d,
        "prompts_per_step": N_PROMPTS,
        "num_generations": G,
        "prompt_len": tc.PROMPT_LEN,
        "completion_len": tc.NEW_TOKENS,
        "beta": BETA,
        "steps": STEPS,
        "setup_s": round(setup_s, 2),
        "train_wall_s": round(train_s, 2),
        "step_s_all": [round(x, 3) for x in timer.times],
        "step_s_median_excl_first": round(med, 3),
        "completion_tok_per_s": round(completions * tc.NEW_TOKENS / med, 1),
        "total_tok_per_s": round(completions * (tc.PROMPT_LEN + tc.NEW_TOKENS) / med, 1),
        "mean_completion_len": [h.get("completions/mean_length") for h in logs],
        "rewards": [h.get("reward") for h in logs],
        "losses": [h.get("loss") for h in logs],
    }
    tc.print_threads("torch")
    print(json.dumps(res))
    print(
        f"RESULT trl_grpo {N_PROMPTS}x{G} P={tc.PROMPT_LEN} C={tc.NEW_TOKENS} beta={BETA}: "
        f"{res['step_s_median_excl_first']} s/step (median of steps 2..{STEPS}), "
        f"{res['completion_tok_per_s']} completion tok/s, first step {res['step_s_all'][0]}s"
    )


if __name__ == "__main__":
    main()
