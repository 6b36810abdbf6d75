"""The engine pool over real engine servers on loopback, one killed mid-run."""

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from tunix_agentic.inference import EnginePool, SamplingParams
from tunix_agentic.serving.client import SGLangEngine
from tunix_agentic.testing import TINY_MODEL_OVERRIDES

REPO = Path(__file__).resolve().parents[1]
CONFIG = str(REPO / "configs" / "calculator_tiny.yaml")
SERVER_OVERRIDES = [*TINY_MODEL_OVERRIDES, "engine.max_seq_len=128", "engine.decode_steps=2"]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=40)


async def start_server() -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tunix_agentic",
        "serve-engine",
        "--config",
        CONFIG,
        "--port",
        "0",
        *SERVER_OVERRIDES,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    line = (await asyncio.wait_for(proc.stdout.readline(), timeout=120)).decode()
    assert line.startswith("serving on http://127.0.0.1:"), line
    return proc, line.split()[-1]


async def stop_servers(procs: list[asyncio.subprocess.Process]) -> None:
    for proc in procs:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


@pytest.mark.slow
async def test_killing_a_server_mid_run_loses_no_request():
    procs, clients = [], []
    try:
        for proc, url in await asyncio.gather(*(start_server() for _ in range(3))):
            procs.append(proc)
            clients.append(SGLangEngine(url, request_timeout_s=120))
        pool = EnginePool(clients, names=["a", "b", "c"], health_interval_s=0.5)
        # Same config and seed on every server: same weights, so greedy outputs must agree.
        reference = await pool.generate([5, 6, 7], GREEDY)
        prompts = [[5, 6, 7]] * 30
        tasks = [asyncio.create_task(pool.generate(p, GREEDY)) for p in prompts]
        while clients[1].in_flight == 0:
            await asyncio.sleep(0.01)
        procs[1].send_signal(signal.SIGKILL)  # no goodbye: connections just die
        outs = await asyncio.wait_for(asyncio.gather(*tasks), timeout=300)
        assert all(o.token_ids == reference.token_ids for o in outs)  # none lost, none truncated
        health = pool.health()
        dead = next(b for b in health["backends"] if b["name"] == "b")
        assert not dead["healthy"]
        assert sum(b["served"] for b in health["backends"]) >= 31
        assert all(b["in_flight"] == 0 for b in health["backends"])
        await pool.close()
    finally:
        await stop_servers(procs)


async def test_a_server_restarted_at_another_address_is_followed():
    """A server gone and started again elsewhere (a Ray engine actor restarted on another
    machine): ``repoint`` moves its client there, out of rotation until a health probe
    readmits it; then it serves as before."""
    first, url = await start_server()
    procs = [first]
    try:
        pool = EnginePool([SGLangEngine(url, request_timeout_s=120)], health_interval_s=0.2)
        reference = await pool.generate([5, 6, 7], GREEDY)
        first.kill()
        await first.wait()
        second, new_url = await start_server()  # same config and seed: the same weights
        procs.append(second)
        assert new_url != url
        assert not pool.repoint("http://127.0.0.1:9", new_url)  # nobody was there
        assert pool.repoint(url, new_url)
        (backend,) = pool.health()["backends"]
        assert not backend["healthy"]  # until a probe of the new address answers
        async with asyncio.timeout(60):  # a bound against a hang
            while not pool.health()["backends"][0]["healthy"]:
                await asyncio.sleep(0.1)
        assert pool.backends[0].base_url == new_url
        assert (await pool.generate([5, 6, 7], GREEDY)).token_ids == reference.token_ids
        await pool.close()
    finally:
        await stop_servers(procs)
