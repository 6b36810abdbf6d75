"""Model FLOPs utilization: the FLOP counts on literal numbers, the peak table, the config."""

from __future__ import annotations

import numpy as np
import pytest

from tunix_agentic.config import load_config
from tunix_agentic.metrics.config import MetricsConfig
from tunix_agentic.metrics.mfu import (
    StepMfu,
    decode_flops,
    param_count,
    peak_flops,
    published_peak,
    train_flops,
)


def test_train_flops_are_six_n_per_token_plus_attention():
    # 6 * 1000 * (10 + 20) = 180,000; attention 12 * 2 layers * 8 * (10^2 + 20^2) = 96,000.
    assert train_flops(1000, [10, 20], layers=2, attn_dim=8) == 276_000
    assert train_flops(1000, [10, 20]) == 180_000  # without the attention term
    assert train_flops(1000, []) == 0


def test_decode_flops_are_two_n_per_token():
    assert decode_flops(1000, 50) == 100_000


def test_step_mfu_divides_by_seconds_and_peak():
    mfu = StepMfu(n_params=1000, peak=1e6, layers=1, attn_dim=5)
    # Train: 6 * 1000 * 10 + 12 * 1 * 5 * 100 = 66,000 FLOPs in 2 s of a 1e6 FLOP/s peak.
    # Decode: 5 tokens per busy second * 2 * 1000 FLOPs = 10,000 FLOP/s of 1e6.
    assert mfu.scalars([10], 2.0, 5.0) == {
        "perf/mfu_train": pytest.approx(0.033),
        "perf/mfu_decode": pytest.approx(0.01),
    }
    # No train step timed, no engine busy time known (an engine over HTTP): nothing logged.
    assert mfu.scalars([10], 0.0, None) == {}


@pytest.mark.parametrize(
    ("kind", "peak"),
    [
        ("TPU v4", 275e12),
        ("TPU v5 lite", 197e12),
        ("TPU v5p", 459e12),
        ("TPU v6 lite", 918e12),
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("cpu", None),
    ],
    ids=["v4", "v5e", "v5p", "v6e", "h100-sxm", "h100-pcie", "h200", "a100", "cpu"],
)
def test_published_peak_by_device_kind(kind, peak):
    assert published_peak(kind) == peak


def test_peak_is_the_configured_one_else_measured_on_cpu():
    assert peak_flops(3e9) == 3e9
    measured = peak_flops(None)  # CPU here: a jitted matmul's rate
    assert np.isfinite(measured) and measured > 0


def test_param_count_over_trees():
    base = {"w": np.zeros((3, 5)), "b": np.zeros(5)}
    adapters = {"a": np.zeros((3, 2))}
    assert param_count(base) == 20
    assert param_count(base, None, adapters) == 26


def test_peak_flops_config():
    assert MetricsConfig().peak_flops is None
    cfg = load_config(None, ["metrics.peak_flops=1e12"])  # YAML 1.1 reads 1e12 as a string
    assert cfg.metrics.peak_flops == 1e12
    with pytest.raises(ValueError, match="metrics.peak_flops"):
        MetricsConfig(peak_flops=0)
