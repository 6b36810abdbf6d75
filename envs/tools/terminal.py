"""The ``bash`` tool: one long-lived shell per episode on a pseudo-terminal inside the sandbox.

The shell keeps its state between calls (working directory, variables, functions, background
jobs), as an agent at a terminal expects. Each command is delivered as ANSI-C quoted text and
run with ``eval``, followed by a ``printf`` of a random per-shell sentinel carrying ``$?``:
the sentinel marks the end of the command's output and gives its exit code, and a syntax
error or an unclosed quote in the agent's command cannot leave the shell waiting for more
input. Lines stay under the terminal's 4096-byte line limit by building long commands
across several assignments.

A command that runs past its timeout is interrupted with Ctrl-C; if the shell does not answer
within a grace period (the command ignores SIGINT, or reads the terminal), the shell and all
its processes are killed and a fresh one starts on the next call, and the agent is told that
its state was lost. The shell reads no start-up file from the agent's home (the working
directory): no profile, rc, ``.inputrc`` or ``.bash_history``. An infrastructure fault (the sandbox is closed, the shell cannot start)
raises :class:`~tunix_agentic.envs.tools.ToolUnavailable`; everything the agent causes comes
back as text.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets

import ptyprocess

from tunix_agentic.envs.sandbox import OutputCapture, Sandbox, SandboxError, truncate_middle
from tunix_agentic.envs.tools.base import Tool, ToolUnavailable

NO_OUTPUT = "(no output)"
_CHUNK_CHARS = 200  # of command text per input line: <= 800 bytes once escaped
_MARKER_ROOM = 160  # bytes held back from the capture in case a sentinel is split across reads
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def ansi_c_quote(text: str) -> str:
    """``text`` as the inside of a bash ``$'...'`` string with only printable characters.

    Control characters would be acted on by the terminal (Ctrl-C, Ctrl-D, erase...) before
    bash saw them, so every one is written as ``\\xHH``.
    """
    out: list[str] = []
    for ch in text:
        code = ord(ch)
        if ch == "\\":
            out.append("\\\\")
        elif ch == "'":
            out.append("\\'")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        else:
            out.append(ch)
    return "".join(out)


def clean_terminal_output(text: str) -> str:
    """Terminal output as a reader would see it: CRLF as LF, no escape sequences, and of a
    line redrawn with carriage returns (a progress bar) only its last state."""
    text = _ANSI.sub("", text.replace("\r\n", "\n"))
    lines = []
    for line in text.split("\n"):
        if "\r" in line:
            parts = [p for p in line.split("\r") if p]
            line = parts[-1] if parts else ""
        lines.append(line)
    return "\n".join(lines)


class _Collector:
    """Collects one command's output until a sentinel ``\\n<prefix>_<token>_<code>__\\n``."""

    def __init__(self, limit_bytes: int, tokens: tuple[str, ...]):
        self.capture = OutputCapture(limit_bytes)
        self.pending = bytearray()
        self.set_tokens(tokens)
        self.found: tuple[str, int] | None = None  # (token, exit code)

    def set_tokens(self, tokens: tuple[str, ...]) -> None:
        alternatives = b"|".join(re.escape(t.encode()) for t in tokens)
        self.pattern = re.compile(rb"\r?\n__TX_(" + alternatives + rb")_(-?\d+)__\r?\n")

    def feed(self, data: bytes) -> None:
        if self.found is not None:
            return
        self.pending += data
        match = self.pattern.search(self.pending)
        if match:
            self.capture.feed(bytes(self.pending[: match.start()]))
            self.found = (match.group(1).decode(), int(match.group(2)))
            self.pending.clear()
            return
        if len(self.pending) > _MARKER_ROOM:
            self.capture.feed(bytes(self.pending[:-_MARKER_ROOM]))
            del self.pending[:-_MARKER_ROOM]


class _PtyShell:
    """An interactive bash on a sandbox pty, read and written without blocking the loop."""

    def __init__(self, sandbox: Sandbox, proc: ptyprocess.PtyProcess):
        self.sandbox = sandbox
        self.proc = proc
        self.fd = proc.fd
        self.loop = asyncio.get_running_loop()
        self.token = secrets.token_hex(8)
        self.counter = 0
        self.eof = False
        self.collector: _Collector | None = None
        self.changed = asyncio.Event()
        os.set_blocking(self.fd, False)
        self.loop.add_reader(self.fd, self._on_readable)

    def _on_readable(self) -> None:
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return
        except OSError:  # EIO: every process holding the terminal has exited
            data = b""
        if not data:
            self.eof = True
            self.loop.remove_reader(self.fd)
        elif self.collector is not None:
            self.collector.feed(data)
        # Output between commands (a background job's) is dropped: nobody asked for it.
        self.changed.set()

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self.eof:
                raise EOFError("the shell exited")
            try:
                written = os.write(self.fd, view)
            except BlockingIOError:
                waiter = self.loop.create_future()
                self.loop.add_writer(self.fd, waiter.set_result, None)
                try:
                    await asyncio.wait_for(waiter, 1.0)
                except TimeoutError:
                    pass
                finally:
                    self.loop.remove_writer(self.fd)
                continue
            except OSError as exc:
                raise EOFError(f"the shell's terminal is closed: {exc}") from exc
            view = view[written:]

    def new_token(self) -> str:
        self.counter += 1
        return f"{self.token}{self.counter}"

    @staticmethod
    def sentinel_line(token: str, code: str = '"$?"') -> bytes:
        # The sentinel is printed from pieces, so an echo of this line never matches it.
        return f"printf '\\n%s_%s_%d__\\n' __TX {token} {code}\n".encode()

    async def wait(self, collector: _Collector, timeout: float) -> bool:
        """Waits until ``collector`` saw its sentinel (True) or EOF (False); TimeoutError."""
        async with asyncio.timeout(timeout):
            while collector.found is None and not self.eof:
                self.changed.clear()
                await self.changed.wait()
        return collector.found is not None

    def kill(self) -> None:
        """Kills the shell and everything it started (its sandbox's whole PID namespace).

        :meth:`Sandbox.kill` also takes the pty off the event loop before closing it.
        """
        self.eof = True
        self.sandbox.kill(self.proc)


class BashTool(Tool):
    """Runs commands in one persistent bash per episode, inside ``sandbox``.

    ``timeout`` (default: the sandbox's ``timeout_s``) limits each command; the output is
    cut to ``max_output_chars`` with a ``[... N characters truncated ...]`` marker in the
    middle; a non-zero exit status is reported as a last line ``[exit code: N]``. The shell
    starts on the first call. :meth:`close` kills it (so does closing the sandbox).
    """

    name = "bash"
    description = (
        "Run a bash command in this episode's persistent shell (the working directory, "
        "environment variables and background jobs persist between calls). Returns the "
        "combined stdout and stderr, and the exit code when it is not 0."
    )
    parameters = {
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The bash command line(s) to run."}
        },
        "required": ["command"],
    }

    def __init__(
        self,
        sandbox: Sandbox,
        *,
        timeout: float | None = None,
        max_output_chars: int = 10_000,
        interrupt_grace_s: float = 2.0,
        startup_timeout_s: float = 30.0,
    ):
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        if max_output_chars < 100:
            raise ValueError(f"max_output_chars must be >= 100, got {max_output_chars}")
        self.sandbox = sandbox
        self.timeout = float(timeout if timeout is not None else sandbox.config.timeout_s)
        self.max_output_chars = int(max_output_chars)
        self.interrupt_grace_s = float(interrupt_grace_s)
        self.startup_timeout_s = float(startup_timeout_s)
        self._shell: _PtyShell | None = None
        self._lock = asyncio.Lock()
        self._note: str | None = None  # told to the agent with the next command's output

    async def run(self, command: str) -> str:  # type: ignore[override]
        """Runs ``command``; returns its output (see the class docstring)."""
        async with self._lock:
            try:
                return await self._run(command)
            except ToolUnavailable:
                raise
            except BaseException:
                # Cancelled mid-command (or failed unexpectedly): the shell's state is unknown.
                if self._shell is not None and not self._shell.eof:
                    self._drop_shell(
                        "[the previous command was cancelled; the shell was restarted, so the "
                        "working directory, variables and background jobs were reset]"
                    )
                raise

    async def _run(self, command: str) -> str:
        shell = await self._ensure_shell()
        token = shell.new_token()
        collector = _Collector(4 * self.max_output_chars, (token,))
        shell.collector = collector
        lines = self._command_lines(command, token)
        notes: list[str] = []  # about this command: after its output
        earlier, self._note = self._note, None  # about an earlier one: before it
        try:
            await shell.write(lines)
            done = await shell.wait(collector, self.timeout)
        except TimeoutError:
            done = await self._interrupt(shell, collector, token)
            if done:
                notes.append(f"[command timed out after {self.timeout:g}s and was interrupted]")
            else:
                self._drop_shell(None)
                notes.append(
                    f"[command timed out after {self.timeout:g}s; the shell was restarted, so "
                    "the working directory, variables and background jobs were reset]"
                )
        except EOFError:
            done = False
        if not done and shell.eof and self._shell is shell:
            self._drop_shell(None)
            status = shell.proc.exitstatus
            how = f" with exit code {status}" if status is not None else ""
            notes.append(
                f"[the shell exited{how}; a new one starts with the next command (working "
                "directory, variables and background jobs were reset)]"
            )
        shell.collector = None
        text = self._format(collector, notes)
        return f"{earlier}\n{text}" if earlier else text

    def _format(self, collector: _Collector, notes: list[str]) -> str:
        if collector.found is None:  # never finished: keep what arrived
            collector.capture.feed(bytes(collector.pending))
        cap = collector.capture
        head = clean_terminal_output(cap.head.decode("utf-8", "replace"))
        tail = clean_terminal_output(cap.tail.decode("utf-8", "replace"))
        text = truncate_middle(head, self.max_output_chars, dropped=cap.dropped, tail=tail)
        parts = [text.rstrip("\n")] if text.strip() else []
        code = collector.found[1] if collector.found is not None else None
        if code:
            parts.append(f"[exit code: {code}]")
        parts.extend(notes)
        return "\n".join(parts) or NO_OUTPUT

    @staticmethod
    def _command_lines(command: str, token: str) -> bytes:
        pieces = [command[i : i + _CHUNK_CHARS] for i in range(0, len(command), _CHUNK_CHARS)]
        lines = ["__tx=''"] + [f"__tx+=$'{ansi_c_quote(p)}'" for p in pieces]
        # eval and the sentinel share one line: bash has read all of it before the command
        # runs, so a command that reads the terminal (cat) cannot swallow the sentinel.
        sentinel = _PtyShell.sentinel_line(token, '"$__trc"').decode()
        lines.append(f'eval "$__tx"; __trc=$?; unset __tx; {sentinel}')
        return "\n".join(lines).encode("utf-8", "replace")

    async def _interrupt(self, shell: _PtyShell, collector: _Collector, token: str) -> bool:
        """Ctrl-C, then a fresh sentinel; True if the shell answered within the grace period."""
        if shell.eof:
            return False
        recovery = shell.new_token()
        collector.set_tokens((token, recovery))
        try:
            await shell.write(b"\x03")
            await asyncio.sleep(0.05)  # let the interrupt land before the next line
            await shell.write(_PtyShell.sentinel_line(recovery))
            if not await shell.wait(collector, self.interrupt_grace_s):
                return False
            if collector.found is not None and collector.found[0] == token:
                # The command ended just as it was interrupted; resynchronise on the recovery.
                resync = _Collector(1024, (recovery,))
                shell.collector = resync
                return await shell.wait(resync, self.interrupt_grace_s)
            return True
        except (TimeoutError, EOFError):
            return False

    async def _ensure_shell(self) -> _PtyShell:
        if self.sandbox.closed:
            raise ToolUnavailable("the sandbox is closed")
        if self._shell is not None and not self._shell.eof and not self._shell.proc.closed:
            return self._shell
        if self._shell is not None:
            self._drop_shell(None)
        # Nothing the agent can write is read at start: no profile or rc file, no readline
        # (~/.inputrc) and, with +o history, no ~/.bash_history (a planted one of the largest
        # file the sandbox allows would cost every new shell its size in memory and time).
        argv = ["bash", "--noprofile", "--norc", "--noediting", "+o", "history", "-i"]
        try:
            proc = self.sandbox.spawn_pty(argv)
        except SandboxError as exc:
            raise ToolUnavailable(f"cannot start the sandbox shell: {exc}") from exc
        shell = _PtyShell(self.sandbox, proc)
        token = shell.new_token()
        collector = _Collector(1 << 16, (token,))
        shell.collector = collector
        setup = (
            "stty -echo 2>/dev/null; PS1=''; PS2=''; PS0=''; PROMPT_COMMAND=''; "
            "unset HISTFILE; set +H +o history\n"
        )
        try:
            await shell.write(setup.encode() + _PtyShell.sentinel_line(token, "0"))
            ok = await shell.wait(collector, self.startup_timeout_s)
        except (TimeoutError, EOFError):
            ok = False
        if not ok:
            shell.kill()
            cap = collector.capture
            cap.feed(bytes(collector.pending))
            said = clean_terminal_output(cap.text(2000)).strip()
            raise ToolUnavailable(f"the sandbox shell did not start: {said or 'no output'}")
        shell.collector = None
        self._shell = shell
        return shell

    def _drop_shell(self, note: str | None) -> None:
        if self._shell is not None:
            self._shell.kill()
            self._shell = None
        if note:
            self._note = note

    async def close(self) -> None:
        """Kills the shell; the next call would start a new one."""
        self._drop_shell(None)
