"""The mesh's shape as configured (``learner.mesh`` / ``engine.mesh``): plain Python, no JAX,
so a run config loads on machines that never touch an accelerator (rollout nodes).
:mod:`tunix_agentic.sharding` builds the mesh from it."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """``fsdp`` x ``tp`` devices; ``fsdp: -1`` takes all the devices ``tp`` leaves.

    ``devices``: which of ``jax.devices()`` the mesh uses, as ``"start:stop"``
    (empty: all of them); a disaggregated run gives the learner and the engine
    different ranges.
    """

    # Devices on the fsdp axis: a batch's rows and each weight's model dimension are split
    # over them; -1: all the devices tp leaves.
    fsdp: int = 1
    # Devices on the tensor-parallel axis (heads, MLP hidden units and the vocabulary are
    # split over them); fsdp x tp must be the number of devices the mesh uses.
    tp: int = 1
    devices: str = ""

    def __post_init__(self):
        if self.fsdp == 0 or self.fsdp < -1:
            raise ValueError(f"mesh.fsdp must be >= 1 or -1 (all devices), got {self.fsdp}")
        if self.tp < 1:
            raise ValueError(f"mesh.tp must be >= 1, got {self.tp}")
        if self.devices:
            _parse_range(self.devices)

    @property
    def trivial(self) -> bool:
        """One device, the default: nothing to shard."""
        return self.fsdp == 1 and self.tp == 1 and not self.devices


def _parse_range(spec: str) -> slice:
    try:
        start, stop = (int(x) if x.strip() else None for x in spec.split(":"))
    except ValueError:
        raise ValueError(
            f"mesh.devices must look like 'start:stop' (e.g. '0:4'), got {spec!r}"
        ) from None
    return slice(start, stop)
