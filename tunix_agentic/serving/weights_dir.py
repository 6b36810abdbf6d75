"""Where an HTTP engine client writes the weights its server loads, and who cleans them.

A client (:class:`~tunix_agentic.serving.client.SGLangEngine`) writes each version to
``ROOT/v{version}-{writer_id}``: ``ROOT`` is the ``weights_dir`` it was given (shared with
other clients and runs) or a ``tunix-weights-*`` directory of its own under the temporary
directory. While it lives it holds an exclusive ``flock`` on ``ROOT/.lock-{writer_id}``
(the kernel drops it with the process, however the process ends). Its directories go:

* on :meth:`WeightsDirs.close` and, should nobody call it, at interpreter exit;
* after a crash (SIGKILL, OOM), at the next start of any client on the same machine:
  before its first write it removes the directories of every writer whose lock nobody
  holds, in its ``ROOT`` and in the ``tunix-weights-*`` directories of the temporary
  directory. A lock held is a live writer: its directories are never touched.

Nothing here imports JAX.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import tempfile
import weakref
from pathlib import Path

logger = logging.getLogger(__name__)

_LOCK_PREFIX = ".lock-"
_OWN_PREFIX = "tunix-weights-"


def inside(real: str | Path, roots: tuple[Path, ...]) -> bool:
    """Whether ``real`` (a path without links) lies inside one of ``roots``."""
    return any(Path(real) == root or Path(real).is_relative_to(root) for root in roots)


class WeightsDirs:
    """The weights directories of one writer (see the module docstring). ``root``: a
    shared ``weights_dir``, or None for a temporary directory of its own."""

    def __init__(self, root: str | Path | None, writer_id: str):
        self.writer_id = writer_id
        self._given = Path(root) if root is not None else None
        self._state: dict[str, object] = {"root": None, "fd": None, "owned": False}
        self._finalizer = weakref.finalize(self, _clean_up, self._state, writer_id)

    @property
    def root(self) -> Path | None:
        return self._state["root"]  # type: ignore[return-value]

    def path_for(self, version: int) -> Path:
        """The directory to write ``version`` to; the first call takes the lock (and first
        removes what dead writers left)."""
        if self._state["fd"] is None:
            self._open()
        return self.root / f"v{int(version)}-{self.writer_id}"

    def _open(self) -> None:
        sweep_dead_writers(self._given)
        if self._given is not None:
            self._given.mkdir(parents=True, exist_ok=True)
            root, owned = self._given, False
        else:
            root, owned = Path(tempfile.mkdtemp(prefix=_OWN_PREFIX)), True
        fd = os.open(
            root / f"{_LOCK_PREFIX}{self.writer_id}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
        )
        fcntl.flock(fd, fcntl.LOCK_EX)  # a fresh name: nobody else holds it
        self._state.update(root=root, fd=fd, owned=owned)

    def close(self) -> None:
        """Remove this writer's directories (all of its own temporary one) and drop the lock."""
        self._finalizer()


def _clean_up(state: dict[str, object], writer_id: str) -> None:
    root, fd = state["root"], state["fd"]
    if root is None or fd is None:
        return
    if state["owned"]:
        shutil.rmtree(root, ignore_errors=True)
    else:
        _remove_writer(root, writer_id)
    os.close(fd)
    state.update(root=None, fd=None)


def _remove_writer(root: Path, writer_id: str) -> None:
    for path in root.glob(f"v*-{writer_id}"):
        shutil.rmtree(path, ignore_errors=True)
    (root / f"{_LOCK_PREFIX}{writer_id}").unlink(missing_ok=True)


def sweep_dead_writers(root: Path | None = None) -> list[Path]:
    """Remove the weights directories of writers whose lock nobody holds, in ``root`` (a
    shared ``weights_dir``) and in the temporary directory's ``tunix-weights-*``
    directories (removed whole once no writer is left in them). Returns what it removed;
    errors are logged, never raised (a sweep is housekeeping)."""
    removed: list[Path] = []
    roots = [root] if root is not None and root.is_dir() else []
    roots += sorted(Path(tempfile.gettempdir()).glob(f"{_OWN_PREFIX}*"))
    for r in roots:
        try:
            dead = _sweep_root(r)
            removed += dead
            if dead and r.name.startswith(_OWN_PREFIX) and not any(r.glob(f"{_LOCK_PREFIX}*")):
                shutil.rmtree(r, ignore_errors=True)
        except OSError as exc:
            logger.warning("could not sweep weights directories in %s: %s", r, exc)
    if removed:
        logger.warning("removed %d weights directories dead writers left", len(removed))
    return removed


def _sweep_root(root: Path) -> list[Path]:
    removed = []
    for lock in root.glob(f"{_LOCK_PREFIX}*"):
        writer_id = lock.name[len(_LOCK_PREFIX) :]
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            continue  # its writer closed meanwhile
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue  # a live writer
        try:
            removed += [p for p in root.glob(f"v*-{writer_id}")]
            _remove_writer(root, writer_id)
        finally:
            os.close(fd)
        removed.append(lock)
    return removed
