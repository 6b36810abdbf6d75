"""A TPU topology that is not present, from libtpu's description of it, and the meshes
a run's config asks for on it."""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

from jax.sharding import Mesh

from tunix_agentic.aot.chips import CHIPS, Chip
from tunix_agentic.mesh_config import MeshConfig, _parse_range
from tunix_agentic.sharding import make_mesh


class AotError(ValueError):
    """What makes a run impossible to compile for a topology, found before compiling."""


# libtpu's names per generation (the docs' "v5e-8" is "v5e:2x4", "v5p-8" is "v5p:2x2x1").
_NAME = re.compile(r"^(v4|v5e|v5p|v6e):(\d+(?:x\d+){1,2})$")


@dataclasses.dataclass(frozen=True)
class Topology:
    """The ``devices`` of a named TPU topology (abstract: compile for them, run nothing)."""

    name: str
    chip: Chip
    devices: tuple[Any, ...]

    def mesh(self, cfg: MeshConfig, field: str) -> Mesh:
        """The mesh ``cfg`` (``learner.mesh`` / ``engine.mesh``) names on these devices;
        :class:`AotError` naming ``field`` when it wants more chips than there are."""
        devices = list(self.devices)
        if cfg.devices:
            picked = devices[_parse_range(cfg.devices)]
            stop = _parse_range(cfg.devices).stop
            if stop is not None and stop > len(devices):
                raise AotError(
                    f"{field}.devices={cfg.devices!r} wants chips up to {stop}; "
                    f"{self.name} has {len(devices)}"
                )
            devices = picked
        want = cfg.fsdp * cfg.tp if cfg.fsdp != -1 else cfg.tp
        if cfg.trivial:
            devices = devices[:1]
        if want > len(devices):
            raise AotError(
                f"{field} wants fsdp={cfg.fsdp} x tp={cfg.tp} = {want} chips; "
                f"{self.name} gives it {len(devices)}"
            )
        try:
            return make_mesh(cfg, devices)
        except ValueError as exc:
            raise AotError(f"{field}: {exc} on {self.name}") from None


def get_topology(name: str) -> Topology:
    """The topology named like libtpu names them (``v5e:2x4``, ``v5p:2x2x1``, ``v6e:2x4``,
    ``v4:2x2x1``; one chip: ``v5e:1x1``). Needs libtpu (the ``tpu`` extra)."""
    m = _NAME.match(name)
    if m is None:
        raise AotError(
            f"--topology {name!r}: expected GENERATION:SHAPE with GENERATION one of "
            f"v4, v5e, v5p, v6e (e.g. v5e:2x4 for a v5e-8, v5p:2x2x1 for a v5p-8, v6e:2x4)"
        )
    # Compiling touches no chip: let several processes (a test beside a run) load libtpu.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    dims = [int(x) for x in m.group(2).split("x")]
    try:
        desc = topologies.get_topology_desc(platform="tpu", topology_name=name)
    except ImportError as exc:
        raise AotError(
            f"--topology {name}: libtpu is missing (pip install '.[tpu]'): {exc}"
        ) from None
    except Exception as exc:  # noqa: BLE001 - libtpu's errors are JaxRuntimeErrors
        if "divisible" not in str(exc):
            raise AotError(f"--topology {name}: libtpu refuses it: {str(exc)[:300]}") from None
        # Smaller than one host (v5e:1x1): the host is the topology itself.
        bounds = tuple(dims + [1] * (3 - len(dims)))
        try:
            desc = topologies.get_topology_desc(
                platform="tpu", topology_name=name, chips_per_host_bounds=bounds
            )
        except Exception as exc2:  # noqa: BLE001
            raise AotError(f"--topology {name}: libtpu refuses it: {str(exc2)[:300]}") from None
    return Topology(name, CHIPS[m.group(1)], tuple(desc.devices))
