"""Both HTTP servers against a hostile client: what a client may ask of serve-env, read
timeouts on slow requests, JSON for every error, and the API key kept off the command line.

Real servers on 127.0.0.1 with free ports; a raw socket plays the slow client."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
import yaml

from tunix_agentic.cli.main import main as cli_main
from tunix_agentic.envs.base import Action, register_env
from tunix_agentic.envs.calculator import ArithmeticEnv
from tunix_agentic.envs.remote import RemoteEnv, RemoteEnvError
from tunix_agentic.envs.swe_lite import RepoTasks
from tunix_agentic.envs.tools import ToolCall
from tunix_agentic.inference import EngineConfig, JaxEngine
from tunix_agentic.serving import engine_server, env_server
from tunix_agentic.serving.env_server import EnvServerConfig, start_env_server
from tunix_agentic.serving.http import ServerTimeouts
from tunix_agentic.testing import spawn_serve_env, tiny_model

REPO = Path(__file__).resolve().parents[1]
TINY_CONFIG = str(REPO / "configs" / "calculator_tiny.yaml")
QUICK = ServerTimeouts(header_s=0.5, body_s=0.5, idle_s=0.5)
BOUND_S = 15.0  # a wait that only stops a hang; never a timing under test


async def post(url: str, body) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as r:
        return r.status, await r.json()


# --- item: a client cannot choose the sandbox -----------------------------------------------


@pytest.mark.parametrize(
    "env, kwargs, status, named",
    [
        ("swe_lite", {"sandbox": {"backend": "process", "network": True}}, 400, "sandbox"),
        ("swe_lite", {"tool_timeout": 1e6}, 400, "tool_timeout"),
        ("math_python", {"sandbox": {"uid_base": 1000}, "max_python_calls": 2}, 400, "sandbox"),
        ("arithmetic", {"tool_timeout": 2.5}, 200, None),
        ("frozenlake", {"max_turns": 3, "step_penalty": 0.1}, 200, None),
        ("test-hardening-closed", {"tool_timeout": 1.0}, 400, "tool_timeout"),
    ],
    ids=["sandbox", "resource-knob", "sandbox-beside-allowed", "allowed", "rules", "unlisted"],
)
async def test_client_kwargs_are_whitelisted_per_environment(env, kwargs, status, named):
    runner, port = await start_env_server(EnvServerConfig(env))
    try:
        got, body = await post(f"http://127.0.0.1:{port}/envs", {"env": env, "kwargs": kwargs})
        assert got == status, body
        if named is not None:
            message = body["error"]["message"]
            assert f"'{named}'" in message and body["error"]["type"] == "ValueError", message
        else:
            assert body["episode_id"]
    finally:
        await runner.cleanup()


register_env("test-hardening-closed")(ArithmeticEnv)  # a user's env that declares no keywords


def test_register_env_checks_client_kwargs():
    with pytest.raises(ValueError, match="'sandbox'.*operator"):
        register_env("test-hardening-bad", client_kwargs=("sandbox",))(ArithmeticEnv)
    with pytest.raises(ValueError, match="'no_such_knob'"):
        register_env("test-hardening-bad", client_kwargs=("no_such_knob",))(ArithmeticEnv)


async def test_episodes_run_in_the_operators_sandbox(tmp_path):
    """serve-env --config RUN.yaml: its env.sandbox section is every episode's sandbox, and
    a client asking for another gets a 400 naming the key."""
    config = tmp_path / "run.yaml"
    policy = {"cpu_s": 17, "memory_mb": 1536, "max_procs": 48}
    config.write_text(yaml.safe_dump({"env": {"name": "swe_lite", "sandbox": policy}}))
    proc, url = spawn_serve_env("--env", "swe_lite", "--config", str(config))
    try:
        hostile = RemoteEnv(url, env_kwargs={"sandbox": {"backend": "process", "cpu_s": 1000}})
        task = RepoTasks().task(0, seed=0, split="train")
        with pytest.raises(RemoteEnvError, match="'sandbox'") as info:
            await hostile.reset(task)
        assert info.value.status == 400
        await hostile.close()
        env = RemoteEnv(url)
        try:
            await env.reset(task)
            probe = ToolCall("bash", {"command": "ulimit -t; ulimit -v"})
            step = await env.step(Action(text="", tool_calls=(probe,)))
            assert step.messages[0]["content"].split() == ["17", str(1536 * 1024)]
        finally:
            await env.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=BOUND_S) == 0
        finally:
            proc.kill()


def test_serve_env_refuses_an_operator_kwarg_its_environment_does_not_take(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"env": {"name": "swe_lite", "kwargs": {"nope": 1}}}))
    argv = ["serve-env", "--env", "swe_lite", "--config", str(config), "--port", "0"]
    assert cli_main(argv) == 2
    assert "nope" in capsys.readouterr().err


# --- items: read timeouts on heads and bodies, JSON for every error -------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine():
    eng = JaxEngine(tiny_model(seed=3), EngineConfig(max_slots=2, max_seq_len=64))
    yield eng
    await eng.close()


@pytest_asyncio.fixture(loop_scope="module", params=["serve-env", "serve-engine"])
async def serve(request, engine):
    """Starts the server under test with the given timeouts: ``(port, a POST route)``."""
    runners = []

    async def start(timeouts: ServerTimeouts) -> tuple[int, str]:
        if request.param == "serve-env":
            config = EnvServerConfig("arithmetic", timeouts=timeouts)
            runner, port = await start_env_server(config)
            route = "/envs"
        else:
            runner, port = await engine_server.start_server(engine, timeouts=timeouts)
            route = "/generate"
        runners.append(runner)
        return port, route

    yield start
    for runner in runners:
        await runner.cleanup()


in_module_loop = pytest.mark.asyncio(loop_scope="module")


async def _until_closed(reader: asyncio.StreamReader) -> bytes:
    """What the server sends until it closes the connection (the wait only stops a hang)."""
    data = b""
    async with asyncio.timeout(BOUND_S):
        try:
            while chunk := await reader.read(65536):
                data += chunk
        except ConnectionResetError:
            pass
    return data


async def _trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A header line every 0.1 s until the server hangs up: a head that keeps coming
    must not keep its connection."""
    for i in range(int(BOUND_S / 0.1)):
        await asyncio.sleep(0.1)
        if reader.at_eof():
            return
        try:
            writer.write(f"X-Slow-{i}: 1\r\n".encode())
            await writer.drain()
        except (ConnectionError, RuntimeError):
            return


@in_module_loop
async def test_slow_heads_and_bodies_are_cut_off(serve):
    port, path = await serve(QUICK)
    streams = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
    try:
        (_, silent), (trickled_r, trickled), (partial_r, partial), (slow_r, slow) = streams
        trickled.write(f"POST {path} HTTP/1.1\r\nHost: x\r\n".encode())
        partial.write(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-".encode())
        slow.write(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: 1000\r\n\r\n{{".encode()
        )
        dripping = asyncio.ensure_future(_trickle(trickled_r, trickled))
        for reader in (streams[0][0], trickled_r, partial_r):
            assert await _until_closed(reader) == b""  # closed without an answer
        await dripping
        head, _, body = (await _until_closed(slow_r)).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 "), head
        error = json.loads(body)["error"]
        assert "body" in error["message"] and error["type"] == "RequestTimeout"
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/health") as r:
            assert r.status == 200  # the server itself kept serving
    finally:
        for _, writer in streams:
            writer.close()


@in_module_loop
async def test_every_error_is_json(serve, monkeypatch):
    monkeypatch.setattr(env_server, "MAX_BODY_BYTES", 4096)
    monkeypatch.setattr(engine_server, "MAX_BODY_BYTES", 4096)
    port, path = await serve(ServerTimeouts())
    base = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as s:
        for method, route, data, status in [
            ("POST", path, b"[" * 5000, 413),
            ("GET", "/no-such-route", None, 404),
            ("GET", path, None, 405),
        ]:
            async with s.request(method, base + route, data=data) as r:
                assert r.status == status and r.content_type == "application/json"
                error = (await r.json())["error"]
                assert error["message"] and error["type"], error
        async with s.post(base + path, data=b"[" * 5000) as r:
            assert "4096" in (await r.json())["error"]["message"]


def test_server_timeouts_are_validated():
    with pytest.raises(ValueError, match="header_s"):
        ServerTimeouts(header_s=0)
    with pytest.raises(ValueError, match="body_s"):
        ServerTimeouts(body_s=float("nan"))


# --- item: the API key belongs in the environment -------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["serve-env", "--env", "no-such-env", "--api-key", "k", "--port", "0"],
        ["serve-engine", "--config", TINY_CONFIG, "--api-key", "k", "bad.key=1"],
    ],
    ids=["serve-env", "serve-engine"],
)
def test_api_key_on_the_command_line_warns(argv, capsys):
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert "warning" in err and "TUNIX_AGENTIC_API_KEY" in err and "/proc" in err, err
