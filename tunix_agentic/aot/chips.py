"""What each accelerator can do at its peak: the roofline's denominators.

Figures per chip, dense bf16 matrix FLOP/s and HBM bandwidth and capacity, from the
vendors' product pages (checked 2026-12-04):

- TPU v4: 275 TFLOP/s, 1,228 GB/s, 32 GiB (cloud.google.com/tpu/docs/v4)
- TPU v5e: 197 TFLOP/s, 819 GB/s, 16 GiB (cloud.google.com/tpu/docs/v5e)
- TPU v5p: 459 TFLOP/s, 2,765 GB/s, 95 GiB (cloud.google.com/tpu/docs/v5p)
- TPU v6e (Trillium): 918 TFLOP/s, 1,640 GB/s, 32 GiB (cloud.google.com/tpu/docs/v6e)
- H200 SXM: 989 TFLOP/s dense bf16, 4.8 TB/s, 141 GB (nvidia.com/en-us/data-center/h200)
"""

from __future__ import annotations

import dataclasses

GiB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
    """One accelerator's peaks: ``flops`` (bf16 FLOP/s), ``hbm_bw`` (bytes/s), ``hbm`` (bytes)."""

    name: str
    flops: float
    hbm_bw: float
    hbm: int

    def roofline_s(self, flops: float, bytes_accessed: float) -> float:
        """The time at the chip's peak: compute or memory, whichever is longer."""
        return max(flops / self.flops, bytes_accessed / self.hbm_bw)


CHIPS: dict[str, Chip] = {
    "v4": Chip("TPU v4", 275e12, 1228e9, 32 * GiB),
    "v5e": Chip("TPU v5e", 197e12, 819e9, 16 * GiB),
    "v5p": Chip("TPU v5p", 459e12, 2765e9, 95 * GiB),
    "v6e": Chip("TPU v6e", 918e12, 1640e9, 32 * GiB),
    "h200": Chip("H200", 989e12, 4.8e12, 141 * 10**9),
}
