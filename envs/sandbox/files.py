"""The working directory's files, reached from the host without leaving it.

:class:`WorkdirFiles` is the part of :class:`~tunix_agentic.envs.sandbox.Sandbox` that
opens, writes and reads files of the sandbox's working directory from this process: every
path is resolved inside the directory (:func:`~tunix_agentic.envs.sandbox.paths._resolve_in`:
no ``..`` or symlink leads out, each directory opened with ``O_NOFOLLOW``), and files made
here belong to the sandbox's uid.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tunix_agentic.envs.sandbox.paths import _resolve_in


class WorkdirFiles:
    """Files of a started sandbox's working directory (``workdir`` on the host, ``cwd`` as
    its commands see it, owned by ``uid``); ``_check()`` raises once it is closed."""

    workdir: Path | None
    cwd: str | None
    uid: int | None

    def _check(self) -> None:
        """Raises once the sandbox is closed (the sandbox's own check)."""
        raise NotImplementedError

    def resolve(self, path: str) -> tuple[int, str]:
        """Opens the directory that holds ``path`` inside the working directory, safely.

        Returns ``(dir_fd, name)``: an ``O_PATH`` descriptor of the containing directory (the
        caller closes it) and the last component (which may not exist yet; open it with
        ``dir_fd`` and ``O_NOFOLLOW``; ``"."`` when ``path`` names a directory itself, as
        ``"."`` names the working directory). ``path`` is relative to the working directory or
        absolute under :attr:`cwd`. ``..`` components and symlinks that lead outside are
        rejected with ``ValueError``; symlinks inside are followed (an absolute target is
        read as an in-sandbox path, never the host's), and each directory is opened with
        ``O_NOFOLLOW``, so a link swapped in concurrently cannot redirect the walk outside.
        A missing parent directory raises ``FileNotFoundError`` (:meth:`resolve_for_write`
        creates it).
        """
        return self._resolve(path, make_parents=False)

    def resolve_for_write(self, path: str) -> tuple[int, str]:
        """:meth:`resolve`, creating missing parent directories (owned by the sandbox's uid)."""
        return self._resolve(path, make_parents=True)

    def _resolve(self, path: str, *, make_parents: bool) -> tuple[int, str]:
        self._check()
        assert self.workdir is not None and self.cwd is not None
        return _resolve_in(self.workdir, self.cwd, path, uid=self.uid, make_parents=make_parents)

    def write_file(self, path: str, data: str | bytes, *, mode: int = 0o644) -> None:
        """Writes a file in the working directory (parents created), owned by the sandbox's uid.

        For setting up a task before the agent starts; ``path`` as in :meth:`resolve`.
        """
        dir_fd, name = self.resolve_for_write(path)
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(name, flags, mode, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
        with os.fdopen(fd, "wb") as f:
            if self.uid is not None:
                os.fchown(f.fileno(), self.uid, self.uid)
            f.write(data.encode() if isinstance(data, str) else data)

    def read_file(self, path: str, *, binary: bool = False) -> str | bytes:
        """Reads a regular file of the working directory (``path`` as in :meth:`resolve`)."""
        dir_fd, name = self.resolve(path)
        try:
            fd = os.open(
                name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
            )
        finally:
            os.close(dir_fd)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise ValueError(f"{path!r} is not a regular file")
            data = f.read()
        return data if binary else data.decode("utf-8", "replace")
