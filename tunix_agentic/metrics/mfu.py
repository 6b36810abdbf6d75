"""Model FLOPs utilization (MFU) of each RL step: the share of the chip's peak the model's
own arithmetic used.

* ``perf/mfu_train``: the train step's model FLOPs over ``train seconds x peak``. Per
  sequence of ``T`` tokens, ``6 N T`` (forward and backward through ``N`` parameters) plus
  attention's ``12 L d T^2`` (``L`` layers, ``d = heads x head_dim``): PaLM's count
  (Chowdhery et al. 2022, Appendix B), the causal mask not halving it. Only the policy's
  forward and backward count: a reference model's forward, if any, and padding are work
  the step does beyond its model FLOPs.
* ``perf/mfu_decode``: ``2 N`` FLOPs per generated token over ``engine busy seconds x
  peak`` (its device calls, prefills included; none for an engine over HTTP, whose
  device is not seen from here).

The peak (``perf/peak_flops_per_s``, logged once) is ``metrics.peak_flops`` when set, else the
chip's published dense bf16 peak from :data:`PUBLISHED_PEAK` by
``jax.devices()[0].device_kind``, else (CPU, or a chip not in the table) a jitted matmul's
rate, measured once after a warm-up call (the compile is never timed): there MFU is
relative to what this host's matmuls reach, not to a datasheet.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from typing import Any

# Dense bf16 peak FLOP/s per chip, by a substring of jax's device_kind (first match).
PUBLISHED_PEAK: tuple[tuple[str, float], ...] = (
    # cloud.google.com/tpu/docs/v6e: 918 TFLOP/s bf16 per chip ("TPU v6 lite").
    ("TPU v6", 918e12),
    # cloud.google.com/tpu/docs/v5e: 197 TFLOP/s bf16 per chip ("TPU v5 lite").
    ("TPU v5 lite", 197e12),
    ("TPU v5e", 197e12),
    # cloud.google.com/tpu/docs/v5p: 459 TFLOP/s bf16 per chip ("TPU v5p", or "TPU v5").
    ("TPU v5", 459e12),
    # cloud.google.com/tpu/docs/v4: 275 TFLOP/s bf16 per chip.
    ("TPU v4", 275e12),
    # NVIDIA H200 datasheet: the H100 SXM's tensor cores, 989 TFLOP/s dense bf16.
    ("H200", 989e12),
    # NVIDIA H100 datasheet: PCIe 756 TFLOP/s dense bf16 (1,513 with sparsity) ...
    ("H100 PCIe", 756e12),
    # ... SXM ("NVIDIA H100 80GB HBM3") 989 TFLOP/s dense bf16 (1,979 with sparsity).
    ("H100", 989e12),
    # NVIDIA A100 datasheet: 312 TFLOP/s dense bf16.
    ("A100", 312e12),
)


def published_peak(device_kind: str) -> float | None:
    """The chip's dense bf16 peak FLOP/s from :data:`PUBLISHED_PEAK`, or None if unknown."""
    return next((peak for kind, peak in PUBLISHED_PEAK if kind in device_kind), None)


def measure_matmul_flops(n: int = 1024, repeats: int = 5, dtype: str = "float32") -> float:
    """FLOP/s of a jitted ``[n, n] @ [n, n]`` on the default device: the best of ``repeats``
    timed calls after one untimed call that compiles it."""
    import jax
    import jax.numpy as jnp

    a = jnp.ones((n, n), dtype)
    matmul = jax.jit(lambda x: x @ x)
    matmul(a).block_until_ready()  # compiles: never timed
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        matmul(a).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def peak_flops(configured: float | None = None) -> float:
    """The peak FLOP/s MFU is measured against (see the module docstring)."""
    if configured is not None:
        return float(configured)
    import jax

    device = jax.devices()[0]
    peak = published_peak(device.device_kind)
    if peak is not None:
        return peak
    return measure_matmul_flops(dtype="float32" if device.platform == "cpu" else "bfloat16")


def train_flops(
    n_params: int, seq_lens: Iterable[int], layers: int = 0, attn_dim: int = 0
) -> float:
    """Model FLOPs of one forward and backward pass over sequences of ``seq_lens`` tokens:
    ``6 N T + 12 L d T^2`` each (PaLM, Appendix B)."""
    return float(sum(6 * n_params * t + 12 * layers * attn_dim * t * t for t in seq_lens))


def decode_flops(n_params: int, tokens: float) -> float:
    """Model FLOPs of generating ``tokens`` tokens: ``2 N`` each (a forward pass; attention
    over the cache left out)."""
    return 2.0 * n_params * tokens


def param_count(*trees: Any) -> int:
    """Parameters in the given pytrees (None skipped): e.g. a LoRA run's base and adapters."""
    import jax

    return sum(int(x.size) for tree in trees if tree is not None for x in jax.tree.leaves(tree))


@dataclasses.dataclass(frozen=True)
class StepMfu:
    """The run's model size and the peak its RL steps' MFU is measured against."""

    n_params: int
    peak: float  # FLOP/s
    layers: int = 0
    attn_dim: int = 0  # heads x head_dim

    def scalars(
        self, seq_lens: Iterable[int], train_s: float, decode_tokens_per_s: float | None
    ) -> dict[str, float]:
        """``perf/mfu_train`` of a train step on sequences of ``seq_lens`` tokens that took
        ``train_s``, and ``perf/mfu_decode`` where the engine's generated tokens per busy
        second are known."""
        out = {}
        if train_s > 0:
            flops = train_flops(self.n_params, seq_lens, self.layers, self.attn_dim)
            out["perf/mfu_train"] = flops / (train_s * self.peak)
        if decode_tokens_per_s is not None:
            out["perf/mfu_decode"] = decode_flops(self.n_params, decode_tokens_per_s) / self.peak
        return out
