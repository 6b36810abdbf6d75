"""A server on an event loop of its own thread, in a Ray actor's process, and what the
actors share.

Both actors (:mod:`.node_actor`, :mod:`.engine_actor`) run their HTTP server this way:
Ray calls the actor's methods on its own threads, and the server needs a loop that runs
for the actor's whole life. :class:`ServerThread` starts the loop, serves on the port
the actor had before a restart when that is free (else a free one: a new URL, which the
driver learns from the actor), and stops it on :meth:`ServerThread.stop`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import sys
import tempfile
import threading
import warnings
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

# serve(port) -> (port listened on, cleanup): the server started, and how to stop it.
Serve = Callable[[int], Awaitable[tuple[int, Callable[[], Awaitable[None]]]]]

READY_TIMEOUT_S = 300.0  # a server's own start (log replay, tokenizer, model): bounded, not timed
STOP_TIMEOUT_S = 15.0


class ServerThread(threading.Thread):
    """Runs ``serve`` on a loop of this thread until :meth:`stop`; ``start()`` then
    :meth:`wait_ready` returns once it listens (or re-raises why it could not).

    ``setup``, when given, runs first on the loop (building what ``serve`` serves);
    ``teardown`` runs last, after the server's cleanup."""

    def __init__(
        self,
        name: str,
        serve: Serve,
        port: int,
        *,
        setup: Callable[[], Awaitable[None]] | None = None,
        teardown: Callable[[], Awaitable[None]] | None = None,
    ):
        super().__init__(name=name, daemon=True)
        self.serve, self.want_port = serve, port
        self.setup, self.teardown = setup, teardown
        self.port = 0
        self.error: BaseException | None = None
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # before ready: re-raised by wait_ready
            self.error = exc
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        try:
            if self.setup is not None:
                await self.setup()
            try:
                self.port, cleanup = await self.serve(self.want_port)
            except OSError:
                if not self.want_port:
                    raise
                # The port it had is taken: a new URL, which the driver learns and follows.
                self.port, cleanup = await self.serve(0)
            self._ready.set()
            try:
                await self._stopping.wait()
            finally:
                await cleanup()
        finally:
            if self.teardown is not None:
                await self.teardown()

    def wait_ready(self) -> None:
        if not self._ready.wait(READY_TIMEOUT_S):
            raise TimeoutError(f"{self.name} not listening after {READY_TIMEOUT_S:.0f}s")
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        if self._loop is not None and self._stopping is not None and self.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop already ended
                self._loop.call_soon_threadsafe(self._stopping.set)
        self.join(STOP_TIMEOUT_S)


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where an actor's server runs: its URL, Ray node, host address, process and state
    dir. ``restarted``: this process is a restart by Ray; ``jax_loaded``: whether JAX is in
    the process (a rollout node must not load it; an engine does)."""

    name: str
    url: str
    node_id: str
    ip: str
    pid: int
    state_dir: str
    restarted: bool
    jax_loaded: bool

    def describe(self) -> str:
        again = " (restarted by Ray)" if self.restarted else ""
        return (
            f"{self.name} on Ray node {self.node_id[:12]} ({self.ip}), pid {self.pid}, "
            f"at {self.url}{again}"
        )


def state_root_of(state_root: str | None) -> Path:
    """Where an actor's state dirs live on its machine: ``state_root``, or the temporary
    directory's ``tunix-agentic-ray``."""
    return Path(state_root or Path(tempfile.gettempdir()) / "tunix-agentic-ray")


class ServerActor:
    """What both actors share (made remote by :mod:`.fleet`, so this needs no Ray to
    import): a state dir named after the actor (``spec.name``, ``<run>/<role>/<i>``), the
    port it listened on kept there for a restart on the same machine, the server's
    thread, and :meth:`placement` / :meth:`stop`. Subclasses give :meth:`_thread`."""

    def __init__(self, spec: Any):
        import ray

        self.spec = spec
        self.state_dir = state_root_of(spec.state_root).joinpath(*spec.name.split("/"))
        self.state_dir.mkdir(parents=True, exist_ok=True)
        port_file = self.state_dir / "port"
        try:
            port = int(port_file.read_text())
        except (OSError, ValueError):
            port = 0
        context = ray.get_runtime_context()
        self._node_id = context.get_node_id()
        with warnings.catch_warnings():  # Ray's property reads its own deprecated actor_id
            warnings.simplefilter("ignore", DeprecationWarning)
            self._restarted = bool(context.was_current_actor_reconstructed)
        self._ip = ray.util.get_node_ip_address()
        self._server = self._thread(self._ip, port)
        self._server.start()
        self._server.wait_ready()
        port_file.write_text(f"{self._server.port}\n")

    def _thread(self, host: str, port: int) -> ServerThread:
        raise NotImplementedError

    def placement(self) -> Placement:
        from tunix_agentic.serving.http import url

        return Placement(
            name=self.spec.name,
            url=url(self._ip, self._server.port),
            node_id=self._node_id,
            ip=self._ip,
            pid=os.getpid(),
            state_dir=str(self.state_dir),
            restarted=self._restarted,
            jax_loaded="jax" in sys.modules,
        )

    def stop(self) -> bool:
        """Stop the server and remove the state dir with the directories above it that are
        left empty: the run is over."""
        self._server.stop()
        shutil.rmtree(self.state_dir, ignore_errors=True)
        root = state_root_of(self.spec.state_root)
        parent = self.state_dir.parent
        while parent != root and root in parent.parents:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent
        return not self._server.is_alive()
