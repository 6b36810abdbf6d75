"""SGLang's own router (``sglang-router`` from PyPI) in front of two of our engine servers:
it registers them from ``/get_server_info`` and ``/get_model_info`` as it registers SGLang
workers, and generates through them."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path

import aiohttp
import pytest

from tunix_agentic.inference import SamplingParams
from tunix_agentic.serving.client import SGLangEngine
from tunix_agentic.testing import TINY_MODEL_OVERRIDES

pytest.importorskip("sglang_router")

REPO = Path(__file__).resolve().parents[1]
CONFIG = str(REPO / "configs" / "calculator_tiny.yaml")
SERVER_OVERRIDES = [*TINY_MODEL_OVERRIDES, "engine.max_seq_len=128", "engine.decode_steps=2"]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)
PROMPT = [5, 6, 7, 8]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _start_engine_server() -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "tunix_agentic", "serve-engine", "--config", CONFIG),
        *("--port", "0", *SERVER_OVERRIDES),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    line = (await asyncio.wait_for(proc.stdout.readline(), timeout=180)).decode()
    assert line.startswith("serving on http://127.0.0.1:"), line
    return proc, line.split()[-1]


async def _workers(http: aiohttp.ClientSession, router: str) -> list[dict]:
    try:
        async with http.get(f"{router}/workers") as resp:
            return (await resp.json())["workers"] if resp.status == 200 else []
    except aiohttp.ClientError:
        return []


@pytest.mark.slow
async def test_sglang_router_registers_and_balances_two_engine_servers(tmp_path):
    procs: list[asyncio.subprocess.Process] = []
    log = open(tmp_path / "router.log", "wb")  # noqa: SIM115 (the router writes it until killed)
    try:
        for proc, _ in (servers := await asyncio.gather(*(_start_engine_server() for _ in "ab"))):
            procs.append(proc)
        urls = [url for _, url in servers]
        port = _free_port()
        router = f"http://127.0.0.1:{port}"
        procs.append(
            await asyncio.create_subprocess_exec(
                *(sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1"),
                *("--port", str(port), "--policy", "round_robin", "--worker-urls", *urls),
                stdout=log,
                stderr=log,
            )
        )
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{urls[0]}/get_server_info") as resp:
                info = await resp.json()
            assert info["served_model_name"] == "random-init(seed=0)"
            assert info["dp_size"] == 1 and info["context_length"] == 128
            assert "model_path" not in info and info["skip_tokenizer_init"] is True
            async with asyncio.timeout(120):  # the router registers workers in the background
                while len(workers := await _workers(http, router)) < 2 or not all(
                    w["is_healthy"] for w in workers
                ):
                    await asyncio.sleep(0.5)
            # The model id comes from our /get_server_info (the router's "unknown" without it).
            assert sorted(w["url"] for w in workers) == sorted(urls)
            assert {w["model_id"] for w in workers} == {"random-init(seed=0)"}

            direct = SGLangEngine(urls[0], request_timeout_s=120)
            through = SGLangEngine(router, request_timeout_s=120)
            expected = await direct.generate(PROMPT, GREEDY)
            outs = await asyncio.gather(*(through.generate(PROMPT, GREEDY) for _ in range(4)))
            # Same config and seed on both servers: same weights, same greedy tokens.
            assert all(o.token_ids == expected.token_ids for o in outs)
            assert all(o.logprobs == pytest.approx(expected.logprobs, abs=1e-4) for o in outs)
            for url in urls:  # round robin: both servers generated
                async with http.get(f"{url}/get_server_info") as resp:
                    (state,) = (await resp.json())["internal_states"]
                assert state["generated_tokens"] >= len(expected.token_ids)
            await direct.close()
            await through.close()
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
        log.close()
