"""The physical floor under a benchmark figure: what this machine's measured matmul peak
and memory bandwidth allow, so each figure can be read as "N x its floor" beside its
ratio to a peer.

Host-side (NumPy, no JAX). The counts:

* train step: 2 FLOPs per parameter per token forward (the tied embedding counts once,
  as the LM head; an untied input embedding is a lookup, no FLOPs), plus attention's two
  ``[T, T]`` products (``4 x layers x heads x head_dim x T`` per token, computed in full
  and masked); backward is twice the forward, so 6 x params x tokens, 8 x with remat
  (the forward again in the backward), plus one forward of a reference model;
* decode: per step, the weights and every row's KV cache read once from memory at the
  measured bandwidth, or the step's FLOPs at the measured peak, whichever is longer (a
  roofline); prefill: the prompt's forward FLOPs at the peak;
* weight sync: the weights read and written once.

The peak and the bandwidth are measured in the same run (``measure_peak``), with NumPy's
BLAS and copies; a benchmark may pass a better peak it measured itself (XLA's matmul).
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder the floor needs (from any config with these fields)."""

    params: int
    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tied: bool = True
    bytes_per_param: int = 4  # float32
    bytes_per_kv: int = 4

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, int) and not isinstance(value, bool) and value < 1:
                raise ValueError(f"ModelShape.{f.name} must be >= 1, got {value}")

    @classmethod
    def from_config(cls, cfg: Any, params: int) -> ModelShape:
        """From a ``ModelConfig`` (or anything with its field names) and a parameter count."""
        return cls(
            params=params,
            vocab_size=cfg.vocab_size,
            d_model=cfg.d_model,
            num_layers=cfg.num_layers,
            num_heads=cfg.num_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            tied=getattr(cfg, "tie_embeddings", True),
        )

    @property
    def matmul_params(self) -> int:
        """Parameters a token multiplies through: all but an untied input embedding."""
        return self.params if self.tied else self.params - self.vocab_size * self.d_model

    @property
    def weight_bytes(self) -> int:
        return self.params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.bytes_per_kv

    def attention_flops_per_token(self, context: int) -> int:
        """QK^T and PV for one query over ``context`` keys, every layer and head."""
        return 4 * self.num_layers * self.num_heads * self.head_dim * context


def forward_flops(shape: ModelShape, rows: int, length: int) -> float:
    """Matmul FLOPs of one forward over ``rows x length`` tokens (attention over all T)."""
    per_token = 2 * shape.matmul_params + shape.attention_flops_per_token(length)
    return float(rows * length * per_token)


def train_flops(
    shape: ModelShape, rows: int, length: int, *, ref: bool = False, remat: bool = False
) -> float:
    """FLOPs of one train step: forward + backward (2x), a recomputed forward with remat,
    a reference model's forward with a KL term."""
    passes = 3 + (1 if remat else 0) + (1 if ref else 0)
    return passes * forward_flops(shape, rows, length)


def decode_floor_s(
    shape: ModelShape, rows: int, prompt: int, new: int, *, flops_per_s: float, bytes_per_s: float
) -> float:
    """Seconds ``new`` decode steps of ``rows`` rows need at least: per step, the weights
    and each row's KV up to its position read once, or the step's FLOPs, the longer."""
    total = 0.0
    for t in range(new):
        context = prompt + t
        read = shape.weight_bytes + rows * context * shape.kv_bytes_per_token
        flops = rows * (2 * shape.matmul_params + shape.attention_flops_per_token(context))
        total += max(read / bytes_per_s, flops / flops_per_s)
    return total


@dataclasses.dataclass(frozen=True)
class MachinePeak:
    """This machine's measured f32 matmul FLOP/s and memory bandwidth (bytes/s)."""

    flops_per_s: float
    bytes_per_s: float
    source: str = "numpy"

    def __post_init__(self):
        if self.flops_per_s <= 0 or self.bytes_per_s <= 0:
            raise ValueError(
                f"peak figures must be > 0, got flops_per_s={self.flops_per_s}, "
                f"bytes_per_s={self.bytes_per_s}"
            )

    def describe(self) -> str:
        return (
            f"f32 matmul peak {self.flops_per_s / 1e9:.1f} GFLOP/s, memory bandwidth "
            f"{self.bytes_per_s / 1e9:.1f} GB/s ({self.source})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "gflops": round(self.flops_per_s / 1e9, 2),
            "gb_per_s": round(self.bytes_per_s / 1e9, 2),
            "source": self.source,
        }


def measure_matmul_flops(n: int = 1024, seconds: float = 0.5) -> float:
    """Best f32 matmul FLOP/s of NumPy's BLAS on ``n x n`` operands over a short loop."""
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    out = np.empty_like(a)
    np.matmul(a, a, out=out)  # warm: threads started, pages touched
    best, t_end = 0.0, time.perf_counter() + seconds
    while True:
        t = time.perf_counter()
        np.matmul(a, a, out=out)
        best = max(best, 2 * n**3 / (time.perf_counter() - t))
        if time.perf_counter() > t_end:
            return best


def measure_bandwidth(mib: int = 256, threads: int | None = None, repeats: int = 3) -> float:
    """Best memory read bandwidth (bytes/s): ``threads`` threads each summing its slice of
    a ``mib`` MiB float32 array (far larger than any cache), best of ``repeats``. NumPy
    releases the GIL in the reduction, so the threads read in parallel."""
    from tunix_agentic.compare.machine import cpu_count

    threads = threads or cpu_count()
    a = np.ones(mib * 2**20 // 4, np.float32)
    parts = np.array_split(a, threads)
    best = 0.0
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(np.add.reduce, parts))  # warm
        for _ in range(repeats):
            t = time.perf_counter()
            list(pool.map(np.add.reduce, parts))
            best = max(best, a.nbytes / (time.perf_counter() - t))
    return best


def measure_peak(*, matmul_n: int = 1024, seconds: float = 0.5, mib: int = 256) -> MachinePeak:
    """This machine's f32 matmul peak and read bandwidth, measured now (about a second)."""
    return MachinePeak(
        measure_matmul_flops(matmul_n, seconds), measure_bandwidth(mib), source="numpy"
    )


@dataclasses.dataclass(frozen=True)
class StepFloor:
    """The least seconds one RL step's parts can take on this machine."""

    prefill_s: float = 0.0
    decode_s: float = 0.0
    train_s: float = 0.0
    sync_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s + self.train_s + self.sync_s

    def ratio(self, measured_s: float) -> float:
        """``measured_s`` over this floor: 1.0 is the machine's limit."""
        return measured_s / self.total_s

    def describe(self) -> str:
        parts = ", ".join(
            f"{name} {1e3 * getattr(self, name + '_s'):.1f} ms"
            for name in ("prefill", "decode", "train", "sync")
            if getattr(self, name + "_s")
        )
        return f"floor {1e3 * self.total_s:.1f} ms ({parts})"

    def to_dict(self) -> dict[str, float]:
        return {
            "total_s": round(self.total_s, 5),
            **{k: round(v, 5) for k, v in dataclasses.asdict(self).items()},
        }


def grpo_step_floor(
    shape: ModelShape,
    peak: MachinePeak,
    *,
    rows: int,
    prompt: int,
    new: int,
    train_length: int,
    ref: bool,
    remat: bool = False,
) -> StepFloor:
    """A GRPO step's floor: prefill ``rows`` prompts, decode ``new`` tokens each, one train
    step over ``rows x train_length`` padded tokens, one weight sync."""
    return StepFloor(
        prefill_s=forward_flops(shape, rows, prompt) / peak.flops_per_s,
        decode_s=decode_floor_s(
            shape, rows, prompt, new, flops_per_s=peak.flops_per_s, bytes_per_s=peak.bytes_per_s
        ),
        train_s=train_flops(shape, rows, train_length, ref=ref, remat=remat) / peak.flops_per_s,
        sync_s=2 * shape.weight_bytes / peak.bytes_per_s,
    )


def decode_floor(
    shape: ModelShape, peak: MachinePeak, *, rows: int, prompt: int, new: int
) -> StepFloor:
    """A generation call's floor: prefill the prompts, decode ``new`` tokens a row."""
    return StepFloor(
        prefill_s=forward_flops(shape, rows, prompt) / peak.flops_per_s,
        decode_s=decode_floor_s(
            shape, rows, prompt, new, flops_per_s=peak.flops_per_s, bytes_per_s=peak.bytes_per_s
        ),
    )
