"""Symlink-safe resolution of a path inside a sandbox's working directory, from the host.

The host writes and reads the sandbox's files (a task's set-up, the file-edit tool) while
sandboxed processes, which own that directory, may have put symlinks anywhere in it. The
walk here opens one directory at a time with ``O_NOFOLLOW`` and follows a link only while it
stays inside, so nothing the sandbox does can make the host touch a file outside. Kept
apart from :mod:`~tunix_agentic.envs.sandbox.core` because it is self-contained and
security-critical: :meth:`~tunix_agentic.envs.sandbox.Sandbox.resolve` documents the rules,
and its file methods call in here.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from tunix_agentic.envs.sandbox.config import _under


def _resolve_in(
    workdir: Path, cwd: str, path: str, *, uid: int | None, make_parents: bool
) -> tuple[int, str]:
    """:meth:`Sandbox.resolve` for the host directory ``workdir``, seen inside as ``cwd``.

    Directories it creates are owned by ``uid`` (when not None).
    """
    parts = _relative_parts(cwd, path) or ["."]  # "." names the working directory itself
    root_fd = os.open(workdir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    stack = [root_fd]
    pending = list(parts)
    hops = 0
    try:
        while True:
            name = pending.pop(0)
            if name in ("", "."):
                if not pending:
                    return stack.pop(), "."
                continue
            if name == "..":  # only from a symlink's target: stays lexically inside
                if len(stack) == 1:
                    raise ValueError(f"{path!r} leads outside the working directory")
                os.close(stack.pop())
                continue
            try:
                st = os.stat(name, dir_fd=stack[-1], follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is not None and stat.S_ISLNK(st.st_mode):
                hops += 1
                if hops > 40:
                    raise ValueError(f"{path!r}: too many levels of symbolic links")
                target = os.readlink(name, dir_fd=stack[-1])
                if target.startswith("/"):
                    inner = _inside(cwd, target)
                    if inner is None:
                        raise ValueError(
                            f"{path!r} is a link that leads outside the working directory"
                        )
                    for fd in stack[1:]:
                        os.close(fd)
                    del stack[1:]
                    pending = [*inner, *pending]
                else:
                    pending = [*target.split("/"), *pending]
                continue
            if not pending:
                return stack.pop(), name
            if st is None:
                if not make_parents:
                    raise FileNotFoundError(f"no such directory: {name!r} in {path!r}")
                os.mkdir(name, 0o755, dir_fd=stack[-1])
                if uid is not None:
                    os.chown(name, uid, uid, dir_fd=stack[-1], follow_symlinks=False)
            flags = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                stack.append(os.open(name, flags, dir_fd=stack[-1]))
            except NotADirectoryError:
                raise NotADirectoryError(f"{name!r} in {path!r} is not a directory") from None
            except OSError as exc:
                if exc.errno == errno.ELOOP:  # swapped for a link since the stat
                    raise ValueError(f"{path!r} changed while it was resolved") from None
                raise
    finally:
        for fd in stack:
            os.close(fd)


def _inside(cwd: str, path: str) -> list[str] | None:
    """The components of an absolute in-sandbox path under ``cwd``, else None."""
    norm = os.path.normpath(path)
    if not _under(norm, cwd):
        return None
    rest = norm[len(cwd) :].strip("/")
    return rest.split("/") if rest else []


def _relative_parts(cwd: str, path: str) -> list[str]:
    if not isinstance(path, str) or not path.strip():
        raise ValueError("path must be a non-empty string")
    if "\0" in path:
        raise ValueError("path must not contain NUL characters")
    raw = path.strip()
    if raw.startswith("/"):
        if ".." in raw.split("/"):
            raise ValueError(f"{path!r} must not contain '..'")
        inner = _inside(cwd, raw)
        if inner is None:
            raise ValueError(f"{path!r} is outside the working directory {cwd}")
        return inner
    parts = raw.split("/")
    if ".." in parts:
        raise ValueError(f"{path!r} must not contain '..'")
    return [p for p in parts if p not in ("", ".")]
