"""What each accelerator can do at its peak: the roofline's denominators.

Figures per chip, dense bf16 matrix FLOP/s and HBM bandwidth and capacity, from the
vendors' product pages (checked 2026-12-04):

- TPU v4: 275 TFLOP/s, 1,228 GB/s, 32 GiB (cloud.google.com/tpu/docs/v4)
- TPU v5e: 197 TFLOP/s, 819 GB/s, 16 GiB (cloud.google.com/tpu/docs/v5e)
- TPU v5p: 459 TFLOP/s, 2,765 GB/s, 95 GiB (cloud.google.com/tpu/docs/v5p)
- TPU v6e (Trillium): 918 TFLOP/s, 1,640 GB/s, 32 GiB (cloud.google.com/tpu/docs/v6e)
- H200 SXM: 989 TFLOP/s dense bf16, 4.8 TB/s, 141 GB (nvidia.com/en-us/data-center/h200)

``ici_bw``: what one chip sends to the others per second, half the bidirectional
inter-chip bandwidth the same pages give per chip (v5e 400 GB/s, v5p 1,200 GB/s, v6e
800 GB/s; the H200's NVLink 900 GB/s). The v4 page gives none: its collectives are left
out of its roofline (said in the table).

``limit``: the HBM the TPU compiler lets a program use, which is less than the nominal
capacity: a program asking more is refused with "exceeds available HBM (15.75G)" on v5e,
95.74G on v5p, 31.25G on v6e (libtpu 0.0.42.1, probed 2026-12-07 by compiling a program
too big for each). "fits" is judged against it.

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
    """One accelerator's peaks: ``flops`` (bf16 FLOP/s), ``hbm_bw`` (bytes/s), ``hbm``
    (bytes), ``ici_bw`` (bytes/s a chip sends; None: not published), ``limit`` (bytes a
    program may use; None: ``hbm``)."""

    name: str
    flops: float
    hbm_bw: float
    hbm: int
    vmem_assignment: str | None = None
    ici_bw: float | None = None
    limit: int | None = None

    @property
    def usable(self) -> int:
        """The bytes a program may use on one chip: the compiler's limit."""
        return self.hbm if self.limit is None else self.limit

    def ici_s(self, ici_bytes: float) -> float:
        return ici_bytes / self.ici_bw if self.ici_bw else 0.0

    def roofline_s(self, flops: float, bytes_accessed: float, ici_bytes: float = 0.0) -> float:
        """The time at the chip's peak: compute, memory or the interconnect, whichever is
        longest (each could overlap the others, so this is a floor)."""
        return max(flops / self.flops, bytes_accessed / self.hbm_bw, self.ici_s(ici_bytes))


CHIPS: dict[str, Chip] = {
    "v4": Chip("TPU v4", 275e12, 1228e9, 32 * GiB),
    "v5e": Chip(
        "TPU v5e",
        197e12,
        819e9,
        16 * GiB,
        "xla_vf_vmem_memory_space_assignment",
        200e9,
        int(15.75 * GiB),
    ),
    "v5p": Chip(
        "TPU v5p",
        459e12,
        2765e9,
        95 * GiB,
        "xla_vf_vmem_memory_space_assignment",
        600e9,
        int(95.74 * GiB),
    ),
    "v6e": Chip(
        "TPU v6e",
        918e12,
        1640e9,
        32 * GiB,
        "xla_gf_vmem_memory_space_assignment",
        400e9,
        int(31.25 * GiB),
    ),
    "h200": Chip("H200", 989e12, 4.8e12, 141 * 10**9, ici_bw=450e9),
}
