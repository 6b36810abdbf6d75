"""Start a real vLLM server for a run's model, with what :class:`VLLMEngine` needs.

vLLM lives in its own interpreter as a rule (its torch build is not the one the rest of
the project may use): ``$TUNIX_AGENTIC_VLLM_PYTHON`` or ``python=`` names it, else this
interpreter. The server is ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm``
console script of the CPU wheel looks up a distribution named ``vllm`` and fails) with
the token route (``--enable-scale-out``), logprobs after temperature
(``--logprobs-mode processed_logprobs``), no sampling defaults from the model's
``generation_config.json`` (``--generation-config vllm``), and the weight routes
(``VLLM_SERVER_DEV_MODE=1``). ``--enforce-eager`` by default: on a CPU the compiled mode
takes minutes to start. Nothing here imports vLLM or JAX.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

VLLM_PYTHON_ENV = "TUNIX_AGENTIC_VLLM_PYTHON"
INSTALL_HINT = (
    "pip install 'tunix-agentic[vllm]' (vLLM's CPU build; on a GPU: pip install vllm) into "
    f"this environment, or name an interpreter that has it in ${VLLM_PYTHON_ENV}"
)


class VLLMUnavailable(RuntimeError):
    """vLLM cannot be imported by the interpreter that would run it (one line, with the
    install command)."""


def vllm_python(python: str | None = None) -> str:
    """The interpreter that runs vLLM: ``python``, ``$TUNIX_AGENTIC_VLLM_PYTHON``, or this
    one; :class:`VLLMUnavailable` when it cannot import vLLM."""
    exe = python or os.environ.get(VLLM_PYTHON_ENV) or sys.executable
    try:
        probe = subprocess.run(
            [exe, "-c", "import vllm.entrypoints.openai.api_server"],
            capture_output=True,
            text=True,
            timeout=300,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VLLMUnavailable(f"cannot run {exe} to start vLLM ({exc}): {INSTALL_HINT}") from exc
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        raise VLLMUnavailable(f"{exe} cannot import vLLM ({last}): {INSTALL_HINT}")
    return exe


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def vllm_command(
    model_dir: str | Path,
    *,
    python: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_model_len: int | None = None,
    dtype: str = "auto",
    max_num_seqs: int | None = None,
    eager: bool = True,
    extra: list[str] | tuple[str, ...] = (),
) -> list[str]:
    """The command line of a vLLM server :class:`VLLMEngine` can use."""
    cmd = [
        python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--host", host,
        "--port", str(port),
        "--dtype", dtype,
        "--enable-scale-out",
        "--logprobs-mode", "processed_logprobs",
        "--generation-config", "vllm",
        "--enable-prompt-tokens-details",
    ]  # fmt: skip
    if eager:
        cmd.append("--enforce-eager")
    if max_model_len is not None:
        cmd += ["--max-model-len", str(int(max_model_len))]
    if max_num_seqs is not None:
        cmd += ["--max-num-seqs", str(int(max_num_seqs))]
    return cmd + list(extra)


def vllm_env(*, kv_cache_gib: float | None = None, api_key: str | None = None) -> dict[str, str]:
    """The environment of a vLLM server: this one with the weight routes on, the CPU KV
    cache's size in GiB (vLLM's CPU build reads ``VLLM_CPU_KVCACHE_SPACE``), idle
    connections kept for a minute (``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``) and the API
    key (``VLLM_API_KEY``; kept off the command line, where every user could read it)."""
    env = dict(os.environ, VLLM_SERVER_DEV_MODE="1")
    # Idle connections kept a minute (vLLM's default is 5 s; clients close theirs at 4).
    env.setdefault("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "60")
    if kv_cache_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = f"{kv_cache_gib:g}"
    if api_key:
        env["VLLM_API_KEY"] = api_key
    return env


# A watchdog process: SIGKILL to vLLM's process group (argv[1]) when its parent thread dies
# (Linux's PR_SET_PDEATHSIG sends it SIGTERM) or has died already. vLLM's engine core is a
# child of its API server, so a death signal armed on the API server alone would leave it.
_WATCHDOG = """
import ctypes, os, signal, sys
group, parent = int(sys.argv[1]), int(sys.argv[2])
def end(*_):
    try:
        os.killpg(group, signal.SIGKILL)
    finally:
        os._exit(0)
signal.signal(signal.SIGTERM, end)
ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)
if os.getppid() != parent:
    end()
while True:
    signal.pause()
"""


class VLLMServer:
    """A vLLM server process: :meth:`start`, :meth:`wait_ready`, :meth:`stop` (or use it as
    a context manager, which does all three). Its output goes to ``log_path`` (else ours)."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        python: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        max_model_len: int | None = None,
        dtype: str = "auto",
        max_num_seqs: int | None = None,
        kv_cache_gib: float | None = 1.0,
        api_key: str | None = None,
        log_path: str | Path | None = None,
        eager: bool = True,
        extra: list[str] | tuple[str, ...] = (),
        die_with_parent: bool = False,
    ):
        if not (Path(model_dir) / "config.json").is_file():
            raise FileNotFoundError(f"{model_dir}: no config.json (not a Hugging Face model dir)")
        self.python = vllm_python(python)
        self.host, self.port = host, port or free_port(host)
        self.cmd = vllm_command(
            model_dir,
            python=self.python,
            host=host,
            port=self.port,
            max_model_len=max_model_len,
            dtype=dtype,
            max_num_seqs=max_num_seqs,
            eager=eager,
            extra=extra,
        )
        self.env = vllm_env(kv_cache_gib=kv_cache_gib, api_key=api_key)
        self.log_path = Path(log_path) if log_path else None
        # Killed when the thread that started it dies (a Ray actor's process SIGKILLed):
        # no vLLM is left holding memory and a port behind a restarted actor.
        self.die_with_parent = die_with_parent
        self.proc: subprocess.Popen | None = None
        self._watchdog: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> VLLMServer:
        """Start the process (its output to ``log_path``, or to ours without one)."""
        out = open(self.log_path, "ab") if self.log_path else None  # noqa: SIM115
        try:
            # Its own process group: stop() ends the API server and its engine core together.
            self.proc = subprocess.Popen(
                self.cmd,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT if out else None,
                start_new_session=True,
            )
        finally:
            if out is not None:
                out.close()
        if self.die_with_parent:
            self._watchdog = subprocess.Popen(
                [sys.executable, "-c", _WATCHDOG, str(self.proc.pid), str(os.getpid())]
            )
        return self

    def _tail(self) -> str:
        if self.log_path is None or not self.log_path.is_file():
            return ""
        lines = self.log_path.read_text(errors="replace").strip().splitlines()
        return "\n".join(lines[-15:])

    def wait_ready(self, timeout_s: float = 600.0) -> None:
        """Until ``GET /health`` answers 200; RuntimeError (with the log's tail) if the
        process ends first or ``timeout_s`` passes."""
        assert self.proc is not None, "start() first"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"vLLM exited with code {self.proc.returncode} while starting:\n{self._tail()}"
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"vLLM was not ready after {timeout_s:.0f}s:\n{self._tail()}")

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM to the server's process group, then SIGKILL to what is left of it after
        ``timeout_s`` or once the API server has ended (its engine core may outlive it).
        The watchdog goes last: a process killed meanwhile still takes vLLM with it."""
        proc, self.proc = self.proc, None
        watchdog, self._watchdog = self._watchdog, None
        try:
            if proc is not None:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGTERM)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout_s)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        finally:
            if watchdog is not None:
                watchdog.kill()
                watchdog.wait()

    def __enter__(self) -> VLLMServer:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
