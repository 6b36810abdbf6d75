"""The ``file_edit`` tool: view, create and edit text files in the sandbox's working directory.

Commands: ``view`` (a file with line numbers, optionally only ``start_line..end_line``, or
a directory's entries), ``create`` (a new file with ``text``; an existing file is refused so
that nothing is overwritten by accident) and ``replace`` (lines ``start_line..end_line``,
inclusive, become ``text``; ``end_line = start_line - 1`` inserts before ``start_line``,
and an empty ``text`` deletes the lines).

The tool works on the host side of the working directory, as this process (often root), so
every path goes through :meth:`Sandbox.resolve`: relative to the working directory (or
absolute under the sandbox's own path for it), no ``..``, no symlink that leads outside,
and every component opened without following links, so an agent cannot race a link in to
reach a host file. Files with several hard links are not edited (one could be a host
file's other name), nor non-regular files (a FIFO would block). Files it creates belong to
the sandbox's uid. The agent's errors come back as ``error: ...`` text; a closed sandbox
raises :class:`~tunix_agentic.envs.tools.ToolUnavailable`.
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat

from tunix_agentic.envs.sandbox import Sandbox, SandboxError, truncate_middle
from tunix_agentic.envs.tools.base import ERROR_PREFIX, Tool, ToolUnavailable

COMMANDS = ("view", "create", "replace")
_CONTEXT_LINES = 3  # shown around an edit
_MAX_ENTRIES = 500  # of a directory listing


class _AgentError(Exception):
    """A mistake of the agent's, reported to it as text."""


DEFAULT_MAX_OUTPUT_CHARS = 10_000


def numbered(lines: list[str], first: int, max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS) -> str:
    """``lines`` as the tool shows them: each after its 1-based number (from ``first``) and a
    tab, cut in the middle past ``max_output_chars``."""
    body = "".join(f"{first + i:6d}\t{line.rstrip(chr(10))}\n" for i, line in enumerate(lines))
    return truncate_middle(body, max_output_chars)


def replace_lines(
    lines: list[str],
    path: str,
    start: int,
    end: int | None,
    text: str,
    *,
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
) -> tuple[list[str], str]:
    """The file's lines after replacing ``start..end`` (1-based, inclusive; ``end`` None:
    ``start``; ``end = start - 1`` inserts) with ``text``, and the tool's reply (a summary
    and the changed region with context). Pure, so a demonstration can know the reply;
    raises ``_AgentError`` with the agent's mistake."""
    end = start if end is None else end
    n = len(lines)
    if not 1 <= start <= n + 1:
        raise _AgentError(f"start_line {start} is out of range: {path} has {n} lines")
    if not start - 1 <= end <= n:
        raise _AgentError(
            f"end_line {end} is out of range: it must be between {start - 1} "
            f"(insert) and {n} (the last line)"
        )
    if text and not text.endswith("\n"):
        text += "\n"
    new = text.splitlines(keepends=True)
    result = lines[: start - 1] + new + lines[end:]
    removed = end - start + 1
    lo = max(1, start - _CONTEXT_LINES)
    hi = min(len(result), start + len(new) - 1 + _CONTEXT_LINES)
    shown = numbered(result[lo - 1 : hi], lo, max_output_chars) if result else ""
    summary = (
        f"replaced {removed} line(s) at {start} of {path} with {len(new)} line(s); "
        f"it now has {len(result)} lines"
    )
    return result, summary + (f":\n{shown}" if shown else "")


class FileEditTool(Tool):
    """View, create and line-replace text files in ``sandbox``'s working directory.

    Files over ``max_file_bytes`` are neither read nor written; a view is cut to
    ``max_output_chars`` with a ``[... N characters truncated ...]`` marker.
    """

    name = "file_edit"
    description = (
        "View, create or edit a text file in the working directory. command='view': show a "
        "file with line numbers (optionally only lines start_line..end_line) or list a "
        "directory. command='create': write a new file whose content is text. "
        "command='replace': replace lines start_line..end_line (inclusive, 1-based) with text "
        "(end_line = start_line - 1 inserts before start_line; empty text deletes the lines)."
    )
    parameters = {
        "type": "object",
        "properties": {
            "command": {"type": "string", "enum": list(COMMANDS)},
            "path": {"type": "string", "description": "Path relative to the working directory."},
            "start_line": {"type": "integer", "description": "First line (1-based)."},
            "end_line": {"type": "integer", "description": "Last line, inclusive."},
            "text": {"type": "string", "description": "New content (create, replace)."},
        },
        "required": ["command", "path"],
    }

    def __init__(
        self,
        sandbox: Sandbox,
        *,
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
        max_file_bytes: int = 1 << 20,
    ):
        if max_output_chars < 100:
            raise ValueError(f"max_output_chars must be >= 100, got {max_output_chars}")
        if max_file_bytes < 1:
            raise ValueError(f"max_file_bytes must be positive, got {max_file_bytes}")
        self.sandbox = sandbox
        self.max_output_chars = int(max_output_chars)
        self.max_file_bytes = int(max_file_bytes)

    async def run(  # type: ignore[override]
        self,
        command: str,
        path: str,
        start_line: int | None = None,
        end_line: int | None = None,
        text: str | None = None,
    ) -> str:
        """Runs one command (see the module docstring) in a worker thread."""
        if self.sandbox.closed:
            raise ToolUnavailable("the sandbox is closed")
        loop = asyncio.get_running_loop()
        args = (command, path, start_line, end_line, text)
        return await loop.run_in_executor(None, self._run_sync, *args)

    def _run_sync(
        self,
        command: str,
        path: str,
        start_line: int | None,
        end_line: int | None,
        text: str | None,
    ) -> str:
        try:
            if command == "view":
                return self._view(path, start_line, end_line)
            if command == "create":
                return self._create(path, text)
            if command == "replace":
                return self._replace(path, start_line, end_line, text)
            raise _AgentError(f"unknown command {command!r}; use one of {', '.join(COMMANDS)}")
        except SandboxError as exc:
            if self.sandbox.closed:
                raise ToolUnavailable(str(exc)) from exc
            return f"{ERROR_PREFIX}{exc}"
        except (_AgentError, ValueError) as exc:
            return f"{ERROR_PREFIX}{exc}"
        except FileNotFoundError:
            return f"{ERROR_PREFIX}{path}: no such file or directory"
        except IsADirectoryError:
            return f"{ERROR_PREFIX}{path} is a directory"
        except NotADirectoryError as exc:
            return f"{ERROR_PREFIX}{exc}"
        except PermissionError:
            return f"{ERROR_PREFIX}{path}: permission denied"
        except OSError as exc:
            return f"{ERROR_PREFIX}{path}: {exc.strerror or exc}"

    # ------------------------------------------------------------------ files
    def _open(self, path: str, flags: int, *, create_parents: bool = False) -> int:
        """An fd of ``path`` inside the working directory (see :meth:`Sandbox.resolve`)."""
        resolve = self.sandbox.resolve_for_write if create_parents else self.sandbox.resolve
        dir_fd, name = resolve(path)
        try:
            flags |= os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            return os.open(name, flags, 0o644, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # the last component became a link after it was resolved
                raise _AgentError(f"{path} changed while it was opened") from None
            raise
        finally:
            os.close(dir_fd)

    def _read_text(self, fd: int, path: str) -> str:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _AgentError(f"{path} is not a regular file")
        if st.st_size > self.max_file_bytes:
            raise _AgentError(
                f"{path} is {st.st_size} bytes, over this tool's limit of {self.max_file_bytes}"
            )
        data = os.pread(fd, self.max_file_bytes + 1, 0)
        if b"\0" in data:
            raise _AgentError(f"{path} is a binary file")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise _AgentError(f"{path} is not UTF-8 text") from None

    def _numbered(self, lines: list[str], first: int) -> str:
        return numbered(lines, first, self.max_output_chars)

    # --------------------------------------------------------------- commands
    def _view(self, path: str, start: int | None, end: int | None) -> str:
        fd = self._open(path, os.O_RDONLY)
        try:
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                return self._listing(fd, path)
            content = self._read_text(fd, path)
        finally:
            os.close(fd)
        lines = content.splitlines(keepends=True)
        if not lines:
            return f"{path} is empty"
        first = 1 if start is None else start
        last = len(lines) if end is None else min(end, len(lines))
        if not 1 <= first <= len(lines):
            raise _AgentError(f"start_line {first} is out of range: {path} has {len(lines)} lines")
        if last < first:
            raise _AgentError(f"end_line {end} is before start_line {first}")
        return self._numbered(lines[first - 1 : last], first)

    def _listing(self, fd: int, path: str) -> str:
        entries = []
        with os.scandir(fd) as it:
            for entry in it:
                is_dir = entry.is_dir(follow_symlinks=False)
                entries.append(entry.name + ("/" if is_dir else ""))
        entries.sort()
        shown = entries[:_MAX_ENTRIES]
        more = (
            f"\n[... {len(entries) - len(shown)} more entries]" if len(shown) < len(entries) else ""
        )
        return ("\n".join(shown) if shown else f"{path} is an empty directory") + more

    def _create(self, path: str, text: str | None) -> str:
        if text is None:
            raise _AgentError("create needs text (the file's content)")
        data = text.encode("utf-8")
        if len(data) > self.max_file_bytes:
            raise _AgentError(f"text is {len(data)} bytes, over the limit of {self.max_file_bytes}")
        try:
            fd = self._open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, create_parents=True)
        except FileExistsError:
            raise _AgentError(f"{path} already exists; use replace to edit it") from None
        try:
            self._own(fd)
            os.write(fd, data)
        finally:
            os.close(fd)
        return f"created {path} ({len(text.splitlines())} lines)"

    def _replace(self, path: str, start: int | None, end: int | None, text: str | None) -> str:
        if start is None:
            raise _AgentError("replace needs start_line")
        if text is None:
            raise _AgentError("replace needs text (the new lines; empty to delete)")
        fd = self._open(path, os.O_RDWR)
        try:
            if os.fstat(fd).st_nlink > 1 and stat.S_ISREG(os.fstat(fd).st_mode):
                raise _AgentError(f"{path} has several hard links; edit a copy of it instead")
            lines = self._read_text(fd, path).splitlines(keepends=True)
            result, message = replace_lines(
                lines, path, start, end, text, max_output_chars=self.max_output_chars
            )
            data = "".join(result).encode("utf-8")
            if len(data) > self.max_file_bytes:
                raise _AgentError(
                    f"the result would be over the limit of {self.max_file_bytes} bytes"
                )
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
        finally:
            os.close(fd)
        return message

    def _own(self, fd: int) -> None:
        """Gives a file this tool created to the sandbox's uid, so its commands can edit it."""
        uid = self.sandbox.uid
        if uid is not None:
            os.fchown(fd, uid, uid)
