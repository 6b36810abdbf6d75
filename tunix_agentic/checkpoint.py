"""Checkpoints with orbax: parameters, optimizer state, step and run metadata.

A checkpoint holds three items: ``params``, ``opt_state`` and ``meta``, so a
reader that needs the model alone (an engine server, an export) restores
``params`` without building an optimizer.

Metadata (JSON) carries what a resumed run needs beyond arrays: the policy
version, the task iterator's state, and figures measured before the
checkpoint (the warm-start success).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp


@dataclasses.dataclass
class Restored:
    """A checkpoint read back; ``skipped`` lists the newer ones that could not be read,
    newest first, as ``(step, why)``."""

    params: Any
    opt_state: Any
    meta: dict[str, Any]
    step: int
    skipped: list[tuple[int, str]]


class UnreadableCheckpointsError(RuntimeError):
    """No checkpoint of a directory could be read; ``skipped`` as in :class:`Restored`."""

    def __init__(self, directory: Path, skipped: list[tuple[int, str]]):
        self.skipped = skipped
        step, why = skipped[0]
        older = f"; nor any of the {len(skipped) - 1} older" if skipped[1:] else ""
        super().__init__(f"cannot read checkpoint {step} of {directory} ({why}){older}")


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

    def restore_newest(
        self,
        params_like: Any,
        opt_state_like: Any,
        *,
        check: Callable[[dict[str, Any]], None] | None = None,
    ) -> Restored | None:
        """The newest checkpoint that can be read, falling back past any that cannot
        (truncated or corrupted files), or None when there is none.

        ``check(meta)`` sees each one's metadata first; what it raises propagates (a
        checkpoint the run refuses is no reason to try an older one). Raises
        :class:`UnreadableCheckpointsError` when none can be read.
        """
        skipped: list[tuple[int, str]] = []
        for step in reversed(self.all_steps()):
            try:
                meta = self.read_meta(step)
            except Exception as exc:
                skipped.append((step, _first_line(exc)))
                continue
            if check is not None:
                check(meta)
            try:
                params, opt_state, meta, step = self.restore(params_like, opt_state_like, step)
            except Exception as exc:
                skipped.append((step, _first_line(exc)))
                continue
            return Restored(params, opt_state, meta, step, skipped)
        if skipped:
            raise UnreadableCheckpointsError(self.directory, skipped)
        return None

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


def set_aside(directory: str | Path, steps: list[int], aside: str | Path) -> None:
    """Move checkpoints ``steps`` of ``directory`` (unreadable ones a resume skipped) into
    ``aside``, kept for a post-mortem, so a run writes those steps afresh. Call it with no
    :class:`Checkpointer` open on ``directory``."""
    for step in steps:
        target = Path(aside) / str(step)
        n = 1
        while target.exists():
            n += 1
            target = target.with_name(f"{step}-{n}")
        target.parent.mkdir(parents=True, exist_ok=True)
        (Path(directory) / str(step)).rename(target)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


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
