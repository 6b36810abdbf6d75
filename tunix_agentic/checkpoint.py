"""Checkpoints with orbax: parameters, optimizer state, step and run metadata.

Metadata (JSON) carries what a resumed run needs beyond arrays: the policy
version, the task iterator's state, and figures measured before the
checkpoint (the warm-start success).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp


class Checkpointer:
    """Saves and restores ``{"params", "opt_state"}`` plus JSON metadata by step."""

    def __init__(self, directory: str | Path, *, max_to_keep: int = 2):
        self.directory = Path(directory).absolute()
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True),
        )

    def save(self, step: int, params: Any, opt_state: Any, meta: dict[str, Any]) -> None:
        self._manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave({"params": params, "opt_state": opt_state}),
                meta=ocp.args.JsonSave(meta),
            ),
        )
        self._manager.wait_until_finished()

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def restore(
        self, params_like: Any, opt_state_like: Any, step: int | None = None
    ) -> tuple[Any, Any, dict, int]:
        """Restore into trees shaped like the given ones; returns (params, opt_state, meta, step)."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint under {self.directory}")
        target = jax.tree.map(
            ocp.utils.to_shape_dtype_struct, {"params": params_like, "opt_state": opt_state_like}
        )
        out = self._manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()
            ),
        )
        return out["state"]["params"], out["state"]["opt_state"], dict(out["meta"]), step

    def close(self) -> None:
        self._manager.close()


def save_params(path: str | Path, params: Any) -> Path:
    """Write parameters alone (for remote weight sync); returns the absolute path.

    An engine server loads them with :func:`load_params` when told to via
    ``POST /update_weights_from_disk``.
    """
    path = Path(path).absolute()
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path, params, force=True)
    checkpointer.wait_until_finished()
    return path


def load_params(path: str | Path, params_like: Any) -> Any:
    """Read parameters written by :func:`save_params` into a tree shaped like ``params_like``."""
    path = Path(path).absolute()
    if not path.exists():
        raise FileNotFoundError(f"no parameters at {path}")
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, params_like)
    return ocp.StandardCheckpointer().restore(path, target)
