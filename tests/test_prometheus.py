"""``GET /metrics`` on ``serve-engine`` and ``serve-env``: real servers on loopback, read
back with prometheus_client's own parser."""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tunix_agentic.inference import EngineConfig, JaxEngine
from tunix_agentic.serving import start_server
from tunix_agentic.serving.env_server import EnvServerConfig, start_env_server
from tunix_agentic.testing import tiny_model


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    """``{(sample name, sorted labels): value}`` of a /metrics answer."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def _metrics(session: aiohttp.ClientSession, base: str, **kw) -> tuple[int, str]:
    async with session.get(f"{base}/metrics", **kw) as r:
        return r.status, await r.text()


async def test_the_engine_server_exports_its_load_tokens_and_request_latencies():
    engine = JaxEngine(tiny_model(seed=3), EngineConfig(max_slots=4, max_seq_len=64))
    runner, port = await start_server(engine, model_info={"model_path": "tiny"}, api_key="k")
    base, auth = f"http://127.0.0.1:{port}", {"Authorization": "Bearer k"}
    try:
        async with aiohttp.ClientSession() as s:
            body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 4}}
            async with s.post(f"{base}/generate", json=body, headers=auth) as r:
                assert r.status == 200
                out = await r.json()
            status, _ = await _metrics(s, base)  # no key: refused, and counted
            assert status == 401
            status, text = await _metrics(s, base, headers=auth)
        assert status == 200
        got = _samples(text)
        generated = got[("tunix_engine_generated_tokens_total", ())]
        assert generated == engine.stats["generated_tokens"] == len(out["output_ids"])
        assert got[("tunix_engine_slots", ())] == 4
        assert got[("tunix_engine_requests_running", ())] == 0
        assert got[("tunix_engine_up", ())] == 1
        assert got[("tunix_engine_busy_seconds_total", ())] > 0
        ok = (("method", "POST"), ("route", "/generate"), ("status", "200"))
        assert got[("tunix_http_request_seconds_count", ok)] == 1
        refused = (("method", "GET"), ("route", "/metrics"), ("status", "401"))
        assert got[("tunix_http_request_seconds_count", refused)] == 1
        # The scrape itself is the one request in flight while the answer is made.
        assert got[("tunix_http_requests_in_flight", (("route", "/metrics"),))] == 1
        assert got[("tunix_http_requests_in_flight", (("route", "/generate"),))] == 0
    finally:
        await runner.cleanup()
        await engine.close()


async def test_the_env_server_exports_its_open_episodes_by_route_template():
    runner, port = await start_env_server(EnvServerConfig("arithmetic"))
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{base}/envs", json={"env": "arithmetic"}) as r:
                assert r.status == 200, await r.text()
                created = await r.json()
            episode, holder = created["episode_id"], {"X-Episode-Token": created["episode_token"]}
            _, text = await _metrics(s, base)
            assert _samples(text)[("tunix_env_episodes_open", ())] == 1
            async with s.delete(f"{base}/envs/{episode}", headers=holder) as r:
                assert r.status == 200
            async with s.delete(f"{base}/envs/{episode}", headers=holder) as r:  # one 404 more
                assert r.status == 404
            _, text = await _metrics(s, base)
        got = _samples(text)
        assert got[("tunix_env_episodes_open", ())] == 0
        # Labelled by the route's template, not each episode's path.
        deleted = (("method", "DELETE"), ("route", "/envs/{episode_id}"), ("status", "200"))
        gone = (("method", "DELETE"), ("route", "/envs/{episode_id}"), ("status", "404"))
        assert got[("tunix_http_request_seconds_count", deleted)] == 1
        assert got[("tunix_http_request_seconds_count", gone)] == 1
        assert not any(episode in str(key) for key in got)

        # Methods a client makes up are refused before any handler (aiohttp's parser
        # knows a fixed set), so a flood of them adds no series.
        async with aiohttp.ClientSession() as s:
            for name in ("MADEUPA", "MADEUPB", "MADEUPC"):
                async with s.request(name, f"{base}/health") as r:
                    assert r.status == 400
            _, text = await _metrics(s, base)
        methods = {dict(labels).get("method") for _, labels in _samples(text)} - {None}
        assert methods == {"GET", "POST", "DELETE"}
        assert not any("MADEUP" in str(key) for key in got)
    finally:
        await runner.cleanup()
