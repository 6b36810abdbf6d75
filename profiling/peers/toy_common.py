"""What every peer benchmark shares: the toy model's dims, a hub-free tokenizer, the workloads.

Imported from three Pythons (Tunix's JAX venv, the torch venv and ours), so it needs
nothing but the standard library at import time; ``build_tokenizer`` imports
``tokenizers`` and ``transformers`` when called.

* ``MODEL_DIMS``: the tiny Qwen3-style decoder every script builds (4.46M parameters).
* ``build_tokenizer()``: a WordLevel vocabulary (``w<id>`` words) in a
  ``PreTrainedTokenizerFast``, built in memory.
* ``make_prompts()``: the decode benchmarks' prompts (BOS + ``PROMPT_LEN - 1`` words).
* ``RLWorkload``: the multi-turn agentic workload of ``profiling/bench_rl_workload.py``
  (tasks x G episodes, a shared system prompt, turns with observations between them).
"""

from __future__ import annotations

import dataclasses
import os
import random
import statistics

# The same numbers go into Tunix's Qwen3 ModelConfig, transformers' Qwen3Config and ours.
MODEL_DIMS = {
    "num_layers": 4,
    "d_model": 256,  # embed_dim / hidden_size
    "ffn_dim": 1024,  # SwiGLU hidden width
    "num_heads": 4,
    "num_kv_heads": 2,  # grouped-query attention
    "head_dim": 64,
    "vocab_size": 2048,
    "rope_theta": 1_000_000,
    "norm_eps": 1e-6,
    "tied_embedding": True,
    "dtype": "float32",
}

BATCH = int(os.environ.get("ANCHOR_BATCH", 16))
PROMPT_LEN = int(os.environ.get("ANCHOR_PROMPT_LEN", 32))  # BOS included
NEW_TOKENS = int(os.environ.get("ANCHOR_NEW_TOKENS", 64))
REPEATS = int(os.environ.get("ANCHOR_REPEATS", 5))

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
SPECIAL_IDS = [PAD_ID, BOS_ID, EOS_ID, UNK_ID]
FIRST_WORD = len(SPECIAL_IDS)  # ids below this are never sampled nor written


def param_count(dims: dict = MODEL_DIMS) -> int:
    """Parameters of the toy decoder: embedding (tied: also the LM head), per layer q/k/v/o,
    SwiGLU's three matrices, two RMSNorms and q/k-norm, and the final norm."""
    d, hd, layers = dims["d_model"], dims["head_dim"], dims["num_layers"]
    attn = d * hd * (2 * dims["num_heads"] + 2 * dims["num_kv_heads"])
    layer = attn + 3 * d * dims["ffn_dim"] + 2 * d + 2 * hd
    head = 0 if dims["tied_embedding"] else dims["vocab_size"] * d
    return dims["vocab_size"] * d + layers * layer + d + head


THREAD_ENV = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS", "NPROC", "XLA_FLAGS")


def print_threads(side: str) -> None:
    """Print ``THREADS {json}``: this process's intra-op threads, read back by our
    benchmarks (``tunix_agentic.compare.machine.parse_threads``) beside each pair. torch:
    ``torch.get_num_threads()``; JAX: its running ``tf_XLAEigen`` threads (call after a
    computation), else ``NPROC`` or the affinity mask, as XLA sizes its pool."""
    import json
    import sys

    info: dict = {"side": side, "env": {k: os.environ[k] for k in THREAD_ENV if k in os.environ}}
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        info.update(
            intra_op=torch.get_num_threads(),
            source="torch.get_num_threads()",
            interop=torch.get_num_interop_threads(),
        )
    else:
        names = []
        for task in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{task}/comm") as f:
                    names.append(f.read().strip())
            except OSError:
                continue
        running = names.count("tf_XLAEigen")
        nproc = os.environ.get("NPROC", "")
        if running:
            info.update(intra_op=running, source="running tf_XLAEigen threads")
        elif nproc.isdigit():
            info.update(intra_op=int(nproc), source="NPROC")
        else:
            info.update(intra_op=len(os.sched_getaffinity(0)), source="CPU affinity")
    print("THREADS " + json.dumps(info), flush=True)


def kv_bytes_per_token(dims: dict = MODEL_DIMS, itemsize: int = 4) -> int:
    """Bytes of K and V one token holds over all layers (4,096 for the toy model in fp32)."""
    return 2 * dims["num_layers"] * dims["num_kv_heads"] * dims["head_dim"] * itemsize


def build_tokenizer(vocab_size: int = MODEL_DIMS["vocab_size"]):
    """``<pad> <s> </s> <unk>`` then ``w4 ... w{vocab-1}``; left padding, as generation wants."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": PAD_ID, "<s>": BOS_ID, "</s>": EOS_ID, "<unk>": UNK_ID}
    vocab.update({f"w{i}": i for i in range(FIRST_WORD, vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
    )
    hf.padding_side = "left"
    return hf


def words(ids: list[int]) -> str:
    """The text whose tokens are ``ids`` under :func:`build_tokenizer` (no BOS)."""
    return " ".join(f"w{i}" for i in ids)


def make_prompts(
    n: int = BATCH,
    prompt_len: int = PROMPT_LEN,
    vocab_size: int = MODEL_DIMS["vocab_size"],
    seed: int = 0,
) -> list[str]:
    """``n`` prompts of ``prompt_len - 1`` words each: ``prompt_len`` tokens with BOS."""
    rnd = random.Random(seed)
    return [
        words([rnd.randrange(FIRST_WORD, vocab_size) for _ in range(prompt_len - 1)])
        for _ in range(n)
    ]


def timed_calls(call) -> tuple[float, object, list[float], list[float]]:
    """``call(0)`` once untimed (compiles, warms caches), then ``call(1..REPEATS)``, each
    returning (seconds, tokens generated, output). Returns the first call's seconds and
    output, the timed calls' seconds and tokens per second; SystemExit when a completion
    ended before ``NEW_TOKENS`` (the peers' workload has every row run to the end)."""
    first_s, _, first = call(0)
    times, counts = [], []
    for r in range(REPEATS):
        dt, n, _ = call(r + 1)
        times.append(dt)
        counts.append(n)
    if any(c != BATCH * NEW_TOKENS for c in counts):
        raise SystemExit(f"a completion ended early: {counts} tokens")
    return first_s, first, times, [c / s for c, s in zip(counts, times, strict=True)]


def even_word_fraction(completions) -> list[float]:
    """The peers' GRPO reward: the share of a completion's words ``wN`` with N even."""
    out = []
    for text in completions:
        ws = text.split()
        even = sum(1 for w in ws if w[1:].isdigit() and int(w[1:]) % 2 == 0)
        out.append(even / max(len(ws), 1))
    return out


def summarize(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "runs": [round(x, 4) for x in xs]}


# ------------------------------------------------------------ the RL workload
@dataclasses.dataclass(frozen=True)
class RLWorkload:
    """One rollout step of a multi-turn, tool-using RL run, as token ids.

    ``tasks`` x ``group`` episodes (a GRPO group of G samples per task). Every episode's
    first prompt is BOS + a ``system_tokens``-token system prompt (it stands for the
    instructions and the tools' JSON schemas, the same for every task) + a
    ``task_tokens``-token user message (the same for the G episodes of one task). Then
    ``turns`` turns of exactly ``new_tokens`` generated tokens, with an
    ``obs_tokens``-token observation (a tool's output) appended after every turn but the
    last. Ids are drawn from ``seed``: a new seed is a new step (after a weight update
    no cached KV of the last step is valid anyway).
    """

    tasks: int = 8
    group: int = 8
    system_tokens: int = 299
    task_tokens: int = 20
    turns: int = 3
    new_tokens: int = 64
    obs_tokens: int = 32
    vocab_size: int = MODEL_DIMS["vocab_size"]

    def __post_init__(self):
        for f in dataclasses.fields(self):
            if getattr(self, f.name) < 1:
                raise ValueError(f"RLWorkload.{f.name} must be >= 1, got {getattr(self, f.name)}")

    @property
    def episodes(self) -> int:
        return self.tasks * self.group

    def prompt_lengths(self) -> list[int]:
        """Tokens of the whole conversation sent at each turn (BOS included): 320, 416, 512."""
        first = 1 + self.system_tokens + self.task_tokens
        step = self.new_tokens + self.obs_tokens
        return [first + t * step for t in range(self.turns)]

    @property
    def final_length(self) -> int:
        """Tokens of a finished episode: its last prompt and last answer (576)."""
        return self.prompt_lengths()[-1] + self.new_tokens

    @property
    def generated_tokens(self) -> int:
        """Tokens generated in one step, all episodes and turns (12,288)."""
        return self.episodes * self.turns * self.new_tokens

    def resend_prefill_tokens(self) -> int:
        """Prompt tokens a client computes when every turn re-sends the whole conversation."""
        return self.episodes * sum(self.prompt_lengths())

    def _ids(self, n: int, *key: object) -> list[int]:
        rnd = random.Random(repr(key))
        return [rnd.randrange(FIRST_WORD, self.vocab_size) for _ in range(n)]

    def first_prompt(self, seed: int, task: int) -> list[int]:
        """BOS + system prompt + task ``task``'s user message."""
        system = self._ids(self.system_tokens, "system", seed)
        return [BOS_ID, *system, *self._ids(self.task_tokens, "task", seed, task)]

    def observation(self, seed: int, episode: int, turn: int) -> list[int]:
        """The tool output episode ``episode`` sees after turn ``turn`` (its own per episode)."""
        return self._ids(self.obs_tokens, "obs", seed, episode, turn)

    def task_of(self, episode: int) -> int:
        return episode // self.group

    def first_prompts(self, seed: int) -> list[list[int]]:
        """Every episode's first prompt, episodes of one task next to each other."""
        return [self.first_prompt(seed, self.task_of(e)) for e in range(self.episodes)]


def rl_workload_from_env() -> RLWorkload:
    """``RL_TASKS``, ``RL_GROUP``, ``RL_SYSTEM``, ``RL_TASK``, ``RL_TURNS``, ``RL_NEW``, ``RL_OBS``
    override the defaults (``profiling/bench_rl_workload.py`` passes its own to the peers)."""
    d = RLWorkload()
    names = {
        "tasks": "RL_TASKS",
        "group": "RL_GROUP",
        "system_tokens": "RL_SYSTEM",
        "task_tokens": "RL_TASK",
        "turns": "RL_TURNS",
        "new_tokens": "RL_NEW",
        "obs_tokens": "RL_OBS",
    }
    return RLWorkload(**{f: int(os.environ.get(env, getattr(d, f))) for f, env in names.items()})


def rl_workload_env(w: RLWorkload) -> dict[str, str]:
    """The environment that makes :func:`rl_workload_from_env` return ``w``."""
    return {
        "RL_TASKS": str(w.tasks),
        "RL_GROUP": str(w.group),
        "RL_SYSTEM": str(w.system_tokens),
        "RL_TASK": str(w.task_tokens),
        "RL_TURNS": str(w.turns),
        "RL_NEW": str(w.new_tokens),
        "RL_OBS": str(w.obs_tokens),
    }
