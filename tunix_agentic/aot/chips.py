"""What each accelerator can do at its peak: the roofline's denominators.

Figures per chip, dense bf16 matrix FLOP/s and HBM bandwidth and capacity, from the
vendors' product pages (checked 2026-12-04):

- TPU v4: 275 TFLOP/s, 1,228 GB/s, 32 GiB (cloud.google.com/tpu/docs/v4)
- TPU v5e: 197 TFLOP/s, 819 GB/s, 16 GiB (cloud.google.com/tpu/docs/v5e)
- TPU v5p: 459 TFLOP/s, 2,765 GB/s, 95 GiB (cloud.google.com/tpu/docs/v5p)
- TPU v6e (Trillium): 918 TFLOP/s, 1,640 GB/s, 32 GiB (cloud.google.com/tpu/docs/v6e)
- H200 SXM: 989 TFLOP/s dense bf16, 4.8 TB/s, 141 GB (nvidia.com/en-us/data-center/h200)

``vmem_assignment``: the libtpu compiler option that turns off memory-space assignment
into the chip's VMEM (found in libtpu 0.0.42.1: with it false, the compiled program holds
no buffer in memory space 1). XLA's cost analysis counts a prefetch into VMEM as bytes
accessed on both sides, and the reads from VMEM after it, so a program that streams its
weights through VMEM reads as moving them several times; compiled without that
assignment, its bytes accessed are what it moves from HBM
(:func:`~tunix_agentic.aot.compile.run_programs`).
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
    vmem_assignment: str | None = None

    def roofline_s(self, flops: float, bytes_accessed: float) -> float:
        """The time at the chip's peak: compute or memory, whichever is longer."""
        return max(flops / self.flops, bytes_accessed / self.hbm_bw)


CHIPS: dict[str, Chip] = {
    "v4": Chip("TPU v4", 275e12, 1228e9, 32 * GiB),
    "v5e": Chip("TPU v5e", 197e12, 819e9, 16 * GiB, "xla_vf_vmem_memory_space_assignment"),
    "v5p": Chip("TPU v5p", 459e12, 2765e9, 95 * GiB, "xla_vf_vmem_memory_space_assignment"),
    "v6e": Chip("TPU v6e", 918e12, 1640e9, 32 * GiB, "xla_gf_vmem_memory_space_assignment"),
    "h200": Chip("H200", 989e12, 4.8e12, 141 * 10**9),
}
