"""Checkpoints with orbax: parameters, optimizer state, step and run metadata.

A checkpoint holds three items: ``params``, ``opt_state`` and ``meta``, so a
reader that needs the model alone (an engine server, an export) restores
``params`` without building an optimizer.

Metadata (JSON) carries what a resumed run needs beyond arrays: the policy
version, the task iterator's state, and figures measured before the
checkpoint (the warm-start success).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp


class Checkpointer:
    """Saves and restores ``{"params", "opt_state"}`` plus JSON metadata by step.

    Saves are asynchronous (orbax's ``CheckpointManager``): :meth:`save`
    returns once the arrays are copied, the files are written on a background
    thread while training goes on, and a checkpoint becomes visible to
    :meth:`latest_step` only when it is complete, so a process killed mid-write
    leaves the previous one as the latest. The newest ``max_to_keep`` are kept.
    """

    def __init__(self, directory: str | Path, *, max_to_keep: int = 3):
        if max_to_keep < 1:
            raise ValueError(f"max_to_keep must be >= 1, got {max_to_keep}")
        self.directory = Path(directory).absolute()
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=max_to_keep, create=True, enable_async_checkpointing=True
            ),
        )

    def save(self, step: int, params: Any, opt_state: Any, meta: dict[str, Any]) -> None:
        """Start writing checkpoint ``step``; returns before the files are written.

        The arrays are copied first: a donating train step may delete the
        caller's buffers while the write is still under way.
        """
        params, opt_state = jax.tree.map(jnp.copy, (params, opt_state))
        self._manager.save(
            step,
            args=ocp.args.Composite(
                params=ocp.args.StandardSave(params),
                opt_state=ocp.args.StandardSave(opt_state),
                meta=ocp.args.JsonSave(meta),
            ),
        )

    def wait(self) -> None:
        """Block until every save started so far is on disk."""
        self._manager.wait_until_finished()

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def restore(
        self, params_like: Any, opt_state_like: Any, step: int | None = None
    ) -> tuple[Any, Any, dict, int]:
        """Restore into trees shaped like the given ones; returns (params, opt_state, meta, step)."""
        step = self._step(step)
        out = self._manager.restore(
            step,
            args=ocp.args.Composite(
                params=ocp.args.StandardRestore(_like(params_like)),
                opt_state=ocp.args.StandardRestore(_like(opt_state_like)),
                meta=ocp.args.JsonRestore(),
            ),
        )
        return out["params"], out["opt_state"], dict(out["meta"]), step

    def restore_params(self, params_like: Any, step: int | None = None) -> tuple[Any, dict, int]:
        """The parameters alone (no optimizer needed); returns (params, meta, step)."""
        step = self._step(step)
        out = self._manager.restore(
            step,
            args=ocp.args.Composite(
                params=ocp.args.StandardRestore(_like(params_like)), meta=ocp.args.JsonRestore()
            ),
        )
        return out["params"], dict(out["meta"]), step

    def read_meta(self, step: int | None = None) -> dict[str, Any]:
        """The JSON metadata of checkpoint ``step`` (default: the latest) alone."""
        step = self._step(step)
        out = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return dict(out["meta"])

    def _step(self, step: int | None) -> int:
        """``step``, or the latest one; FileNotFoundError when there is none."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint under {self.directory}")
        return step

    def close(self) -> None:
        """Finish pending writes, then release the manager (idempotent)."""
        self._manager.wait_until_finished()
        self._manager.close()


def _like(tree: Any) -> Any:
    return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


def load_run_params(run_dir: str | Path, params_like: Any) -> tuple[Any, int]:
    """The newest checkpoint's parameters of a run directory, and their weight version.

    ``params_like`` is the tree the run saved (see ``GRPOLearner.checkpoint_params``);
    :func:`tunix_agentic.export.load_run_policy` builds it and turns the result into the
    run's policy for export and serving. The trainer restores the optimizer state beside
    the parameters with :meth:`Checkpointer.restore`.
    """
    ckpt = Checkpointer(Path(run_dir) / "checkpoints")
    try:
        params, meta, step = ckpt.restore_params(params_like)
    finally:
        ckpt.close()
    return params, int(meta.get("version", step))


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
