"""The ``python`` tool: a persistent Python interpreter per episode inside the sandbox.

A small driver (:data:`DRIVER`) runs under the sandbox's Python and executes code blocks in
one namespace, so variables and imports persist between calls, like notebook cells. The
block's printed output comes back, then the ``repr`` of a trailing expression (unless None),
then, if it raised, only the traceback's last line (``ZeroDivisionError: division by zero``),
as ToRL feeds errors back to its policy.

Protocol: each message is a decimal byte length, a newline, and that many bytes of UTF-8
JSON; the host sends ``{"code": ...}`` and the driver answers ``{"output", "tail",
"dropped", "error"}``. The driver keeps private copies of the pipes and points the code's
stdin at ``/dev/null`` and its stdout/stderr (file descriptors 1 and 2, so subprocesses'
output is caught too) at a scratch file, so nothing the code prints can break the framing.

Hostile code: the code runs in the driver's own process, so it *can* reach the private
reply pipe and write anything there. The host therefore trusts no frame: a header that is
not a decimal size, a frame over :attr:`PythonTool.max_frame_bytes` (the output cap as
JSON, plus slack; the driver never sends more) or a body that is not a well-formed reply
ends the call with an ``error:`` observation saying the reply was garbled, and the
interpreter restarts as after a timeout. The host reads at most one capped frame, and its
pipe buffer holds at most :data:`_PIPE_LIMIT` bytes beyond it, whatever the code writes.

Start-up: the driver runs as ``python -I -c`` (isolated: no working directory, user site or
``PYTHON*`` variable on its path), so files the agent left in the working directory
(``tempfile.py``, ``json.py``, a user-site ``.pth``) cannot break it. Before the first cell
it opens the path to the agent's code as a plain ``python`` would: the working directory
first (``''``), then ``$PYTHONPATH``, the user site (``~/.local/...``, with its ``.pth``
files) and ``$PYTHONDONTWRITEBYTECODE``; what that does is the first call's output.

Limits: ``max_calls`` calls per episode (later calls get an error and run nothing); a
per-call timeout kills the interpreter, which restarts on the next call, and the agent is
told its state was lost. An interpreter that dies (``os._exit``, the CPU limit) is reported
the same way. A closed sandbox, no interpreter, a launch the host refuses, or an interpreter
that fails to start in a sandbox where nothing ran yet raise
:class:`~tunix_agentic.envs.tools.ToolUnavailable` (infrastructure, never scored). Once code ran
in the sandbox (any tool's), an interpreter that fails to start is reported to the agent as an
``error:`` observation: a disk it filled, processes it left behind that hold the process limit,
or its memory are the agent's doing, and must not pass for infrastructure faults (which stop a
run after enough in a row). The code's output is captured in memory (``memfd``), so a full disk
alone neither stops the interpreter nor hides a cell's output.
"""

from __future__ import annotations

import asyncio
import json
import signal
from typing import Any

from tunix_agentic.envs.sandbox import Sandbox, SandboxError, SandboxProcess, truncate_middle
from tunix_agentic.envs.tools.base import ERROR_PREFIX, Tool, ToolUnavailable
from tunix_agentic.envs.tools.terminal import NO_OUTPUT

# Runs inside the sandbox, under whichever Python 3 it has: standard library only.
DRIVER = r"""
import ast, json, os, signal, site, sys, tempfile, traceback

def _open_to_agent():
    # Isolated mode (-I) kept everything the agent can write off the path while the driver
    # imported its modules; the agent's code gets the path a plain ``python`` would give it.
    sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[0:0] = [""] + extra
    user_site = site.getusersitepackages()
    if os.path.isdir(user_site):
        known = set(sys.path)
        site.addsitedir(user_site)
        added = [p for p in sys.path if p not in known]
        rest = [p for p in sys.path if p in known]
        at = next((i for i, p in enumerate(rest) if p.endswith("-packages")), len(rest))
        sys.path[:] = rest[:at] + added + rest[at:]

def _cut(text, n):
    return text if len(text) <= n else text[: n // 2] + " [...] " + text[len(text) - n // 2 :]

def _driver(limit):
    proto_in = os.fdopen(os.dup(0), "rb", buffering=0)
    proto_out = os.fdopen(os.dup(1), "wb", buffering=0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    try:  # in memory: a sandbox disk the code filled must not silence the next cell
        scratch = os.fdopen(os.memfd_create("python-tool-output"), "w+b")
    except (AttributeError, OSError):
        scratch = tempfile.TemporaryFile()
    os.dup2(scratch.fileno(), 1)
    os.dup2(scratch.fileno(), 2)
    sys.stdin = open(os.devnull)
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = open(fd, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
        setattr(sys, name, stream)
    if hasattr(signal, "SIGXFSZ"):  # a write past the file size limit raises, not kills
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    sys.argv = [""]
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}

    def send(obj):
        data = json.dumps(obj).encode()
        proto_out.write(str(len(data)).encode() + b"\n" + data)

    def receive():
        line = proto_in.readline()
        if not line:
            return None
        size = int(line)
        data = b""
        while len(data) < size:
            chunk = proto_in.read(size - len(data))
            if not chunk:
                return None
            data += chunk
        return json.loads(data.decode())

    traceback.format_exception_only(ValueError, ValueError("warm-up"))  # its lazy imports
    send({"ready": sys.version.split()[0]})
    opened = False
    while True:
        message = receive()
        if message is None:
            return
        os.lseek(1, 0, 0)
        os.ftruncate(1, 0)
        error = None
        try:
            if not opened:
                opened = True
                _open_to_agent()
            tree = ast.parse(message["code"], "<cell>", "exec")
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(body=tree.body.pop().value)
            exec(compile(tree, "<cell>", "exec"), namespace)
            if last is not None:
                value = eval(compile(last, "<cell>", "eval"), namespace)
                if value is not None:
                    print(repr(value))
        except BaseException as exc:
            lines = traceback.format_exception_only(type(exc), exc)
            error = _cut(lines[-1].strip() if lines else type(exc).__name__, limit // 4)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        size = os.lseek(1, 0, 2)
        if size <= 2 * limit:
            head, tail = os.pread(1, size, 0), b""
        else:
            head, tail = os.pread(1, limit, 0), os.pread(1, limit, size - limit)
        send({
            "output": head.decode("utf-8", "replace"),
            "tail": tail.decode("utf-8", "replace"),
            "dropped": max(0, size - 2 * limit),
            "error": error,
        })

_driver(int(sys.argv[1]))
"""

_STATE_LOST = "all variables and imports were lost"
# The host's pipe buffer: a reader pauses the pipe beyond twice this, and a frame header
# (a decimal size and a newline) longer than this is garbled.
_PIPE_LIMIT = 1 << 16


class _Garbled(ValueError):
    """A reply that is not a frame the driver would send (the code wrote to its pipe)."""


class _StartRefused(Exception):
    """The interpreter did not start in a sandbox where code already ran: the agent's doing
    (it sees an ``error:`` observation), not an infrastructure fault."""


class PythonTool(Tool):
    """Runs Python code in one persistent interpreter per episode, inside ``sandbox``.

    ``timeout`` (default: the sandbox's ``timeout_s``) limits each call; ``max_calls``
    bounds the calls per episode; output is cut to ``max_output_chars`` with a
    ``[... N characters truncated ...]`` marker. The interpreter starts on the first call
    (``startup_timeout_s`` bounds that); :meth:`close` kills it. A reply frame over
    :attr:`max_frame_bytes` is garbled (see the module docstring).
    """

    name = "python"
    description = (
        "Run Python code in this episode's persistent interpreter (variables and imports "
        "persist between calls). Returns what the code prints, the value of a final "
        "expression, and for an exception its last traceback line."
    )
    parameters = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "The Python code to run."}},
        "required": ["code"],
    }

    def __init__(
        self,
        sandbox: Sandbox,
        *,
        timeout: float | None = None,
        max_calls: int = 32,
        max_output_chars: int = 10_000,
        startup_timeout_s: float = 30.0,
    ):
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        if max_calls < 1:
            raise ValueError(f"max_calls must be >= 1, got {max_calls}")
        if max_output_chars < 100:
            raise ValueError(f"max_output_chars must be >= 100, got {max_output_chars}")
        self.sandbox = sandbox
        self.timeout = float(timeout if timeout is not None else sandbox.config.timeout_s)
        self.max_calls = int(max_calls)
        self.max_output_chars = int(max_output_chars)
        self.startup_timeout_s = float(startup_timeout_s)
        # The driver sends at most a head and a tail of ``limit`` bytes each and an error line
        # of limit // 4 characters; as JSON, a byte of output is at most 6 bytes (a ``\u`` escape)
        # and a character at most 12 (an escaped surrogate pair).
        self._limit = 4 * self.max_output_chars
        self.max_frame_bytes = 12 * self._limit + 3 * self._limit + 4096
        self.calls = 0
        self._note: str | None = None  # told to the agent with the next call's output
        self._proc: SandboxProcess | None = None
        self._lock = asyncio.Lock()

    async def run(self, code: str) -> str:  # type: ignore[override]
        """Runs ``code``; returns its output (see the module docstring)."""
        async with self._lock:
            if self.calls >= self.max_calls:
                return (
                    f"{ERROR_PREFIX}the python tool's limit of {self.max_calls} calls per "
                    "episode is reached; the code was not run"
                )
            self.calls += 1
            try:
                proc = await self._ensure_interpreter()
            except _StartRefused as exc:
                return f"{ERROR_PREFIX}{exc}"
            try:
                async with asyncio.timeout(self.timeout):
                    await self._send(proc, {"code": code})
                    reply = self._check_reply(await self._receive(proc))
            except TimeoutError:
                await self._drop()
                return (
                    f"{ERROR_PREFIX}the code timed out after {self.timeout:g}s; the interpreter "
                    f"was restarted, so {_STATE_LOST}"
                )
            except _Garbled as exc:
                await self._drop()
                return (
                    f"{ERROR_PREFIX}the interpreter's reply was garbled ({exc}): did the code "
                    "write to the tool's own reply pipe? The interpreter was restarted, so "
                    f"{_STATE_LOST}"
                )
            except (EOFError, ValueError, ConnectionError) as exc:
                status = await self._drop()
                return (
                    f"{ERROR_PREFIX}the Python interpreter died while running this code "
                    f"({_describe_exit(status, exc)}); it was restarted, so {_STATE_LOST}"
                )
            except BaseException:  # cancelled mid-call: the interpreter's state is unknown
                self._kill_now()
                raise
            text = self._format(reply)
            if self._note:
                text, self._note = f"{self._note}\n{text}", None
            return text

    def _format(self, reply: dict[str, Any]) -> str:
        text = truncate_middle(
            str(reply.get("output", "")),
            self.max_output_chars,
            dropped=int(reply.get("dropped", 0)),
            tail=str(reply.get("tail", "")),
        )
        parts = [text.rstrip("\n")] if text.strip() else []
        if reply.get("error"):
            parts.append(str(reply["error"]))
        return "\n".join(parts) or NO_OUTPUT

    async def _ensure_interpreter(self) -> SandboxProcess:
        if self.sandbox.closed:
            raise ToolUnavailable("the sandbox is closed")
        if self._proc is not None and self._proc.returncode is None:
            return self._proc
        if self._proc is not None:
            await self._drop()
        python = self.sandbox.python
        if python is None:
            raise ToolUnavailable("no Python interpreter can run in this sandbox")
        # Code already ran in this sandbox: what stops the interpreter now (a full disk, the
        # process limit taken by its leftovers, its memory) is most likely that code's doing.
        after_code = self.sandbox.launches > 0
        # Enough of a head and tail for max_output_chars of text (4 bytes per character at most).
        # -I: nothing the agent can write (the working directory, user site) is on the path.
        argv = [python, "-I", "-c", DRIVER, str(self._limit)]
        try:
            proc = await self.sandbox.spawn(argv, limit=_PIPE_LIMIT)
        except SandboxError as exc:
            raise ToolUnavailable(f"cannot start the sandbox's Python interpreter: {exc}") from exc
        self._proc = proc
        try:
            async with asyncio.timeout(self.startup_timeout_s):
                hello = await self._receive(proc)
            if "ready" not in hello:
                raise ValueError(f"unexpected greeting {hello!r:.200}")
        except (TimeoutError, EOFError, ValueError, ConnectionError) as exc:
            status = await self._drop()
            if after_code:
                raise _StartRefused(
                    f"the Python interpreter could not start in this sandbox "
                    f"({_describe_exit(status, exc)}): {str(exc)[-600:]}. Code run earlier in "
                    "this sandbox may have used up its disk, memory or process limit; free "
                    "them and call again"
                ) from exc
            raise ToolUnavailable(f"the sandbox's Python interpreter did not start: {exc}") from exc
        return proc

    @staticmethod
    async def _send(proc: SandboxProcess, message: dict[str, Any]) -> None:
        assert proc.stdin is not None
        data = json.dumps(message).encode()
        proc.stdin.write(str(len(data)).encode() + b"\n" + data)
        await proc.stdin.drain()

    async def _receive(self, proc: SandboxProcess) -> dict[str, Any]:
        """One framed reply. EOFError: the interpreter is gone; :class:`_Garbled`: not a frame
        the driver sends. Reads at most :attr:`max_frame_bytes` of body, whatever the header says.
        """
        assert proc.stdout is not None
        try:
            header = await proc.stdout.readline()
        except ValueError:  # no newline within the pipe limit
            raise _Garbled(f"a frame header over {_PIPE_LIMIT} bytes") from None
        if not header:
            raise EOFError("no reply")
        digits = header.strip()
        if not digits.isdigit():
            # Not a frame: most likely the interpreter's own error text (it failed to start).
            rest = await proc.stdout.read(2000)
            said = (header + rest).decode("utf-8", "replace").strip()
            raise _Garbled(f"not a reply: {said[:500]!r}")
        if len(digits) > 18 or int(digits) > self.max_frame_bytes:
            raise _Garbled(
                f"a reply frame of {digits[:40].decode()} bytes, over the tool's limit of "
                f"{self.max_frame_bytes}"
            )
        try:
            data = await proc.stdout.readexactly(int(digits))
        except asyncio.IncompleteReadError as exc:
            raise EOFError("truncated reply") from exc
        try:
            reply = json.loads(data.decode("utf-8", "replace"))
        except (ValueError, RecursionError):  # RecursionError: nested too deep
            raise _Garbled(f"not JSON: {data[:200]!r}") from None
        if not isinstance(reply, dict):
            raise _Garbled(f"not a reply: {reply!r:.200}")
        return reply

    @staticmethod
    def _check_reply(reply: dict[str, Any]) -> dict[str, Any]:
        """``reply`` if it has the fields and types the driver sends, else :class:`_Garbled`."""
        fields = {"output": str, "tail": str, "dropped": int, "error": (str, type(None))}
        for key, kind in fields.items():
            value = reply.get(key)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise _Garbled(f"its field {key!r} is {value!r:.100}")
        if reply["dropped"] < 0:
            raise _Garbled(f"its field 'dropped' is {reply['dropped']}")
        return reply

    async def _drop(self) -> int | None:
        """Kills the interpreter (if any); returns its exit status."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.returncode is None:
            await self.sandbox.terminate(proc)
        else:
            self.sandbox.forget(proc)
        return proc.returncode

    def _kill_now(self) -> None:
        """Kills the interpreter without waiting (for a cancelled call, which cannot wait)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            self.sandbox.kill(proc)
            self._note = f"[the previous call was cancelled; the interpreter was restarted, so {_STATE_LOST}]"

    async def close(self) -> None:
        """Kills the interpreter; the next call would start a new one (with an empty state)."""
        await self._drop()


def _describe_exit(status: int | None, exc: BaseException) -> str:
    """How the interpreter ended, in words (bwrap reports death by signal N as 128+N)."""
    if status is None:
        return str(exc)
    number = -status if status < 0 else status - 128 if status > 128 else None
    if number is not None:
        try:
            return f"killed by {signal.Signals(number).name}"
        except ValueError:
            pass
    return f"exit code {status}"
