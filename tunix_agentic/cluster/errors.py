"""Ray itself, imported on demand, and the errors of placing a run on a cluster."""

from __future__ import annotations

from types import ModuleType

from tunix_agentic.config import ConfigError

# Every actor of every run lives in this Ray namespace, named ``<run>/<role>/<i>``.
NAMESPACE = "tunix-agentic"
INSTALL_LINE = "pip install -e .[ray]"


class RayUnavailable(ConfigError):
    """``rollout.ray`` is set but Ray is not installed here."""


class ClusterTooSmall(ConfigError):
    """The cluster lacks the resources ``rollout.ray`` asks for, or did not place the nodes
    within ``rollout.ray.start_timeout_s``."""


def require_ray() -> ModuleType:
    """The ``ray`` module, or :class:`RayUnavailable` saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise RayUnavailable(
            f"rollout.ray.nodes needs Ray, which is not installed ({exc}): {INSTALL_LINE}"
        ) from None
    return ray
