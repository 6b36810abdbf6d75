import asyncio
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

import aiohttp
import jax
import numpy as np
import pytest
import pytest_asyncio
from flax import nnx

from tunix_agentic.checkpoint import Checkpointer, save_params
from tunix_agentic.cli.main import main
from tunix_agentic.config import ConfigError, load_config
from tunix_agentic.export import engine_from_config
from tunix_agentic.inference import EngineConfig, EngineError, JaxEngine, SamplingParams
from tunix_agentic.learners.state import make_optimizer
from tunix_agentic.models.transformer import Transformer
from tunix_agentic.serving import SGLangEngine, start_server
from tunix_agentic.testing import tiny_model

REPO = Path(__file__).resolve().parents[1]
TINY_CONFIG = str(REPO / "configs" / "calculator_tiny.yaml")
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=9)
MAX_SEQ = 256
GREEDY_SGLANG = {"temperature": 0, "max_new_tokens": 4}
# The test engine's model dims, so a config-built model reuses its eager kernels.
TINY_OVERRIDES = [
    "model.d_model=40",
    "model.num_heads=4",
    "model.num_kv_heads=2",
    "model.head_dim=10",
    "model.ffn_dim=56",
    "engine.max_slots=2",
]
LONG = {"temperature": 0.0, "max_new_tokens": MAX_SEQ}  # long enough to abort mid-way


# Tests that use the shared engine run on one module-wide event loop, the engine's.
in_module_loop = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine():
    # One engine for the module: its compiled prefill/decode serve every test's server.
    # decode_steps=2 keeps a long generation many chunks long, so aborts land mid-way.
    eng = JaxEngine(
        tiny_model(seed=3), EngineConfig(max_slots=4, max_seq_len=MAX_SEQ, decode_steps=2)
    )
    yield eng
    await eng.close()


@pytest_asyncio.fixture(loop_scope="module")
async def url(engine, tmp_path_factory):
    # Weights load only from directories named at start: every test's tmp_path is under this.
    runner, port = await start_server(
        engine,
        model_info={"model_path": "tiny-seed-3"},
        weight_dirs=[tmp_path_factory.getbasetemp()],
    )
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


@pytest_asyncio.fixture(loop_scope="module")
async def client(url):
    c = SGLangEngine(url)
    yield c
    await c.close()


async def call(url: str, path: str, body=None, *, data: bytes | None = None, method="POST"):
    async with aiohttp.ClientSession() as session:
        kwargs = {"data": data} if data is not None else {"json": body}
        async with session.request(method, url + path, **kwargs) as resp:
            return resp.status, await resp.json()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_until(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.001)


# ---------------------------------------------------------------- generate
@pytest.mark.parametrize(
    "sampling",
    [GREEDY, SamplingParams(temperature=1.0, top_k=20, max_new_tokens=9, seed=5)],
    ids=["greedy", "seeded-sampling"],
)
@in_module_loop
async def test_http_generate_equals_in_process(engine, client, sampling):
    prompt = [5, 6, 7, 8]
    ref = await engine.generate(prompt, sampling)
    out = await client.generate(prompt, sampling)
    assert out.token_ids == ref.token_ids
    np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-5)
    assert out.finish_reason == ref.finish_reason == "length"
    assert out.versions == ref.versions == [engine.version] * 9
    assert out.prompt_tokens == 4 and out.latency_s > 0


@in_module_loop
async def test_streamed_generate_hands_on_the_ids_as_they_come(engine, client, url):
    # decode_steps=2: a 12-token generation arrives over several chunks, in order, and
    # the whole output is the unstreamed one (ids, logprobs, versions).
    sampling = SamplingParams(temperature=1.0, top_k=20, max_new_tokens=12, seed=9)
    ref = await engine.generate([5, 6, 7], sampling)
    local: list[list[int]] = []
    out = await engine.generate([5, 6, 7], sampling, on_tokens=local.append)
    remote: list[list[int]] = []
    over_http = await client.generate([5, 6, 7], sampling, on_tokens=remote.append)
    for pieces, got in ((local, out), (remote, over_http)):
        assert len(pieces) > 1 and sum(pieces, []) == got.token_ids == ref.token_ids
        np.testing.assert_allclose(got.logprobs, ref.logprobs, atol=1e-5)
        assert got.versions == ref.versions
    # The wire: SGLang's events, the last one the whole result, then [DONE].
    body = {"input_ids": [5, 6, 7], "sampling_params": {"temperature": 0, "max_new_tokens": 5}}
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/generate", json={**body, "stream": True}) as resp:
            assert resp.content_type == "text/event-stream"
            events = [e for e in (await resp.text()).split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert [c["meta_info"]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert sum((c["output_ids"] for c in chunks[:-1]), []) == chunks[-1]["output_ids"]
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    # Refused before anything streams: a plain 400.
    assert (await call(url, "/generate", {**body, "stream": "yes"}))[0] == 400
    batch = {**body, "input_ids": [[5, 6], [7, 8]], "stream": True}
    status, error = await call(url, "/generate", batch)
    assert status == 400 and "stream takes one prompt" in error["error"]["message"]


@in_module_loop
async def test_generate_response_shape(url):
    status, free = await call(
        url, "/generate", {"input_ids": [4, 5, 6], "sampling_params": {"temperature": 0}}
    )
    assert status == 200 and len(free["output_ids"]) == 128  # SGLang's default max_new_tokens
    stop = free["output_ids"][3]
    first = free["output_ids"].index(stop)
    body = {
        "input_ids": [4, 5, 6],
        "sampling_params": {"temperature": 0, "max_new_tokens": 9, "stop_token_ids": [stop]},
        "return_logprob": True,
        "rid": "shape-1",
    }
    status, out = await call(url, "/generate", body)
    assert status == 200
    assert out["output_ids"] == free["output_ids"][: first + 1]
    meta = out["meta_info"]
    assert set(meta) == {
        "id",
        "finish_reason",
        "prompt_tokens",
        "completion_tokens",
        "cached_tokens",
        "weight_version",
        "output_token_logprobs",
        "output_token_versions",
        "e2e_latency",
    }
    assert meta["id"] == "shape-1"
    assert meta["finish_reason"] == {"type": "stop", "matched": stop}
    assert meta["prompt_tokens"] == 3 and meta["completion_tokens"] == first + 1
    # The same prompt was just served: all but its last token's KV is reused (prefix cache).
    assert meta["cached_tokens"] == 2 and meta["weight_version"].isdigit()
    for (logprob, token, text), want in zip(
        meta["output_token_logprobs"], out["output_ids"], strict=True
    ):
        assert isinstance(logprob, float) and logprob <= 0
        assert token == want and text is None

    status, out = await call(
        url, "/generate", {"input_ids": [4, 5, 6], "sampling_params": {"max_new_tokens": 5}}
    )
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert "output_token_logprobs" not in out["meta_info"]


@in_module_loop
async def test_batched_input_ids_answer_a_list(url):
    sp = {"temperature": 0, "max_new_tokens": 6}
    prompts = [[4, 5, 6], [9, 10], [11]]
    singles = [
        (await call(url, "/generate", {"input_ids": p, "sampling_params": sp}))[1] for p in prompts
    ]
    status, batch = await call(
        url, "/generate", {"input_ids": prompts, "sampling_params": sp, "rid": ["a", "b", "c"]}
    )
    assert status == 200 and isinstance(batch, list)
    assert [r["output_ids"] for r in batch] == [r["output_ids"] for r in singles]
    assert [r["meta_info"]["id"] for r in batch] == ["a", "b", "c"]


@in_module_loop
async def test_concurrent_clients_all_succeed(engine, url):
    prompts = [[i, i + 1, i + 2] for i in range(1, 13)]
    refs = await asyncio.gather(*(engine.generate(p, GREEDY) for p in prompts))
    clients = [SGLangEngine(url, name=f"c{i}") for i in range(3)]
    try:
        outs = await asyncio.gather(
            *(clients[i % 3].generate(p, GREEDY) for i, p in enumerate(prompts))
        )
        assert all(c.in_flight == 0 for c in clients)
    finally:
        for c in clients:
            await c.close()
    assert [o.token_ids for o in outs] == [r.token_ids for r in refs]


# --------------------------------------------------------------- bad input
BAD_BODIES = {
    "bad-json": b"{not json",
    "not-an-object": b"[1, 2, 3]",
    "missing-input-ids": {"sampling_params": {}},
    "text-only": {"text": "hello"},
    "empty": {"input_ids": []},
    "empty-in-batch": {"input_ids": [[1, 2], []]},
    "non-int-id": {"input_ids": [1, "a"]},
    "float-id": {"input_ids": [1, 2.5]},
    "bool-id": {"input_ids": [1, True]},
    "out-of-vocab": {"input_ids": [1, 128]},
    "negative-id": {"input_ids": [-1, 2]},
    "too-long": {"input_ids": [1] * MAX_SEQ},
    "temperature": {"input_ids": [1], "sampling_params": {"temperature": -1}},
    "temperature-type": {"input_ids": [1], "sampling_params": {"temperature": "hot"}},
    "top-p": {"input_ids": [1], "sampling_params": {"top_p": 0}},
    "top-k": {"input_ids": [1], "sampling_params": {"top_k": -2}},
    "max-new-tokens": {"input_ids": [1], "sampling_params": {"max_new_tokens": 0}},
    "stop-ids": {"input_ids": [1], "sampling_params": {"stop_token_ids": "x"}},
    "sampling-not-object": {"input_ids": [1], "sampling_params": 3},
    "rid-type": {"input_ids": [1], "rid": 5},
    "return-logprob-type": {"input_ids": [1], "return_logprob": "yes"},
    "batch-field-count": {"input_ids": [[1], [2]], "rid": ["a"]},
    "duplicate-rid-in-batch": {"input_ids": [[1], [2]], "rid": ["x", "x"]},
}


@pytest.mark.parametrize("body", BAD_BODIES.values(), ids=BAD_BODIES.keys())
@in_module_loop
async def test_malformed_generate_gets_400_and_server_keeps_serving(engine, url, body):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, out = await call(url, "/generate", data=data)
    assert status == 400
    assert isinstance(out["error"]["message"], str) and out["error"]["message"]
    status, out = await call(
        url, "/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}}
    )
    assert status == 200 and len(out["output_ids"]) == 2
    await wait_until(lambda: engine.in_flight == 0)  # nothing of the bad batch left behind


@pytest.mark.parametrize(
    "prompt", [[], [1, 128], [1] * MAX_SEQ], ids=["empty", "out-of-vocab", "too-long"]
)
@in_module_loop
async def test_client_raises_value_error_on_400(client, prompt):
    with pytest.raises(ValueError):
        await client.generate(prompt, GREEDY)
    assert client.health()["ok"]  # a bad request says nothing against the server


# ------------------------------------------------------- status and control
@in_module_loop
async def test_health_and_model_info(engine, url, client):
    status, health = await call(url, "/health", method="GET")
    assert status == 200 and health["status"] == "ok" and health["version"] == engine.version
    assert await client.check_health()
    assert client.health()["ok"] and client.health()["status"] == "ok"
    info = await client.model_info()
    assert info["model_path"] == "tiny-seed-3"
    assert (info["vocab_size"], info["max_seq_len"]) == (128, MAX_SEQ)
    assert info["weight_version"] == str(engine.version)


async def test_closed_engine_answers_503_and_client_raises_engine_error():
    closed = JaxEngine(tiny_model(seed=3), EngineConfig(max_slots=2, max_seq_len=32))
    await closed.close()
    runner, port = await start_server(closed)
    client = SGLangEngine(f"http://127.0.0.1:{port}")
    try:
        status, health = await call(f"http://127.0.0.1:{port}", "/health", method="GET")
        assert status == 503 and health["status"] == "closed"
        assert not await client.check_health()
        with pytest.raises(EngineError):
            await client.generate([1, 2], GREEDY)
    finally:
        await client.close()
        await runner.cleanup()


@in_module_loop
async def test_abort_request_by_rid(engine, url):
    long = asyncio.create_task(
        call(url, "/generate", {"input_ids": [1, 2], "sampling_params": LONG, "rid": "long-1"})
    )
    await wait_until(lambda: engine.health()["active"] > 0)
    status, out = await call(url, "/abort_request", {"rid": "long-1"})
    assert status == 200 and out == {"success": True}
    status, out = await long
    assert status == 200
    assert out["meta_info"]["finish_reason"]["type"] == "abort"
    assert out["meta_info"]["completion_tokens"] < MAX_SEQ - 2
    assert (await call(url, "/abort_request", {"rid": "nobody"})) == (200, {"success": False})
    assert (await call(url, "/abort_request", {}))[0] == 400


@in_module_loop
async def test_cancelled_client_aborts_the_engine_request(engine, client):
    before = engine.stats["generated_tokens"]
    task = asyncio.create_task(client.generate([1, 2], SamplingParams(**LONG)))
    await wait_until(lambda: engine.health()["active"] > 0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_until(lambda: engine.in_flight == 0)
    assert engine.stats["generated_tokens"] - before < MAX_SEQ - 2
    assert client.in_flight == 0


@in_module_loop
async def test_client_timeout_raises_engine_error_and_aborts(engine, url, monkeypatch):
    # A warm tiny engine can finish any generation within a short timeout: the request is
    # held at the server's door until the client has given up, so the timeout always wins.
    from tunix_agentic.serving import engine_server

    held, dropped = asyncio.Event(), asyncio.Event()
    generate_one = engine_server._generate_one

    async def hold_then_generate(*args):
        try:
            await held.wait()
        except asyncio.CancelledError:
            dropped.set()
            raise
        return await generate_one(*args)

    monkeypatch.setattr(engine_server, "_generate_one", hold_then_generate)
    before = engine.stats["generated_tokens"]
    client = SGLangEngine(url, request_timeout_s=0.05)
    try:
        with pytest.raises(EngineError, match="timed out"):
            await client.generate([1, 2], SamplingParams(**LONG))
        await asyncio.wait_for(dropped.wait(), 10)  # the server dropped the abandoned request
    finally:
        held.set()
        await client.close()
    await wait_until(lambda: engine.in_flight == 0)
    assert engine.stats["generated_tokens"] == before


async def test_client_against_closed_port_raises_engine_error():
    client = SGLangEngine(f"http://127.0.0.1:{free_port()}", request_timeout_s=10)
    try:
        with pytest.raises(EngineError):
            await asyncio.wait_for(client.generate([1, 2], GREEDY), timeout=15)
        assert not client.health()["ok"]
        assert not await client.check_health()
    finally:
        await client.close()


# ----------------------------------------------------------------- weights
@in_module_loop
async def test_update_weights_from_disk(engine, url, tmp_path):
    prompt = [3, 1, 4, 1, 5]
    v0 = engine.version
    original = engine.params
    other_params = nnx.state(tiny_model(seed=11), nnx.Param)
    before = await engine.generate(prompt, GREEDY)
    # The other model's in-process output, from this engine with its weights swapped in
    # (a second engine would only cost another compile).
    engine.update_weights(other_params, v0)
    want = await engine.generate(prompt, GREEDY)
    engine.update_weights(original, v0)
    assert want.token_ids != before.token_ids
    client = SGLangEngine(url, weights_dir=str(tmp_path / "sync"))
    try:
        save_params(tmp_path / "other", other_params)
        status, out = await call(
            url, "/update_weights_from_disk", {"model_path": str(tmp_path / "other")}
        )
        assert status == 200 and out["success"] and out["weight_version"] == str(v0 + 1)
        status, out = await call(
            url,
            "/generate",
            {"input_ids": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 9}},
        )
        assert out["output_ids"] == want.token_ids
        assert out["meta_info"]["weight_version"] == str(v0 + 1)
        assert out["meta_info"]["output_token_versions"] == [v0 + 1] * 9

        save_params(tmp_path / "foreign", {"w": np.zeros((3, 5), np.float32)})
        bad = {
            "missing-path": {"model_path": str(tmp_path / "nothing")},
            "no-path": {},
            "mismatched-tree": {"model_path": str(tmp_path / "foreign")},
            "bad-version": {"model_path": str(tmp_path / "other"), "weight_version": "v3"},
        }
        for body in bad.values():
            status, out = await call(url, "/update_weights_from_disk", body)
            assert status == 400 and out["success"] is False and out["message"]
        with pytest.raises(EngineError):
            await client.update_weights_from_disk(tmp_path / "nothing", v0 + 2)

        # The client's asynchronous path: write the original back, then load it as "v0 + 5".
        update = client.update_weights(original, v0 + 5)
        assert await asyncio.wait_for(update, 60) == v0 + 5  # the server applied them
        written = [p.name for p in (tmp_path / "sync").glob("v*")]
        assert written == [f"v{v0 + 5}-{client.writer_id}"]
        out = await client.generate(prompt, GREEDY)
        assert out.token_ids == before.token_ids and out.versions == [v0 + 5] * 9
        assert (await client.model_info())["weight_version"] == str(v0 + 5)
        # A tree the server cannot load: the handle fails with the server's reason.
        update = client.update_weights({"w": np.zeros((3, 5), np.float32)}, v0 + 6)
        with pytest.raises(EngineError, match="cannot load weights"):
            await asyncio.wait_for(update, 60)
        with pytest.raises(EngineError, match="cannot load weights"):
            await client.wait_weights()
        assert engine.version == v0 + 5
    finally:
        await client.close()
        engine.update_weights(original, max(engine.version, v0 + 5))


@in_module_loop
async def test_a_client_that_knows_the_model_sends_safetensors_as_sglang_reads(
    engine, url, tmp_path
):
    """With ``model_cfg`` the client writes Hugging Face safetensors alone (what real
    SGLang and vLLM load; SGLang cannot read orbax), and serve-engine loads them too."""
    prompt = [3, 1, 4, 1, 5]
    original = engine.params
    other = nnx.state(tiny_model(seed=11), nnx.Param)
    engine.update_weights(other, engine.version)
    want = await engine.generate(prompt, GREEDY)
    engine.update_weights(original, engine.version)
    v = engine.version + 1
    client = SGLangEngine(url, model_cfg=engine.model_config, weights_dir=str(tmp_path / "w"))
    try:
        assert await asyncio.wait_for(client.update_weights(other, v), 60) == v
        written = next((tmp_path / "w").glob("v*"))
        assert sorted(p.name for p in written.iterdir()) == ["model.safetensors"]
        out = await client.generate(prompt, GREEDY)
        assert out.token_ids == want.token_ids and out.versions == [v] * len(out.token_ids)
    finally:
        await client.close()
        engine.update_weights(original, max(engine.version, v))


@in_module_loop
async def test_a_foreign_safetensors_directory_is_refused_and_the_weights_kept(
    engine, url, tmp_path
):
    """A directory without the model's tensors (the others missing, one misshaped) is a 400 naming
    the fault; the engine keeps generating with what it had."""
    from safetensors.numpy import save_file

    prompt = [3, 1, 4, 1, 5]
    before = await engine.generate(prompt, GREEDY)
    version = engine.version
    for name, tensors in {
        "missing": {"model.norm.weight": np.ones(40, np.float32)},
        "one-misshaped-tensor": {"model.embed_tokens.weight": np.ones((3, 5), np.float32)},
    }.items():
        (tmp_path / name).mkdir()
        save_file(tensors, str(tmp_path / name / "model.safetensors"))
        status, out = await call(
            url, "/update_weights_from_disk", {"model_path": str(tmp_path / name)}
        )
        assert status == 400 and not out["success"] and "cannot load weights" in out["message"]
    assert engine.version == version
    assert (await engine.generate(prompt, GREEDY)).token_ids == before.token_ids


def test_sglangs_weight_version_spans_label_each_token():
    """Real SGLang (0.5.23) labels tokens by spans, not by our ``output_token_versions``."""
    from tunix_agentic.serving.client import parse_generate_response

    body = {
        "output_ids": [7, 8, 9],
        "meta_info": {
            "output_token_logprobs": [[-0.1, 7, None], [-0.2, 8, None], [-0.3, 9, None]],
            "finish_reason": {"type": "length", "length": 3},
            "weight_version": "4",
            "weight_versions": [
                {"version": "3", "start": 0, "end": 1},
                {"version": "4", "start": 1, "end": 3},
            ],
        },
    }
    assert parse_generate_response(body).versions == [3, 4, 4]
    del body["meta_info"]["weight_versions"]
    assert parse_generate_response(body).versions == [4, 4, 4]


@in_module_loop
async def test_clients_sharing_a_weights_dir_never_write_the_same_directory(engine, url, tmp_path):
    """A pool's clients (one per server) share one weights_dir: each writes its own."""
    shared = tmp_path / "shared"
    writers = [SGLangEngine(url, weights_dir=str(shared)) for _ in range(2)]
    version = engine.version + 1
    try:
        updates = [w.update_weights(engine.params, version) for w in writers]
        assert await asyncio.wait_for(asyncio.gather(*updates), 120) == [version] * 2
        written = sorted(p.name for p in shared.glob("v*"))
        assert written == sorted(f"v{version}-{w.writer_id}" for w in writers)
    finally:
        for writer in writers:
            await writer.close()
    assert not any(shared.iterdir())  # each removed its own last directory


@in_module_loop
async def test_update_weights_loads_the_directory_it_checked(engine, tmp_path, monkeypatch):
    """A link inside --weights-dir swapped to point outside, after the check and before
    the load, must not change what is loaded."""
    from tunix_agentic.serving import weight_load

    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    original = engine.params
    save_params(allowed / "good", original)
    save_params(outside / "evil", nnx.state(tiny_model(seed=11), nnx.Param))
    link = allowed / "link"
    link.symlink_to(allowed / "good")
    load = weight_load.load_like

    def swap_then_load(path, params_like, cfg=None):  # the attacker wins the race every time
        link.unlink()
        link.symlink_to(outside / "evil")
        return load(path, params_like, cfg)

    monkeypatch.setattr(weight_load, "load_like", swap_then_load)
    runner, port = await start_server(engine, weight_dirs=[allowed])
    try:
        status, out = await call(
            f"http://127.0.0.1:{port}", "/update_weights_from_disk", {"model_path": str(link)}
        )
        assert status == 200 and out["success"], out
        loaded = jax.tree.leaves(engine.params)
        assert all(
            np.array_equal(a, b) for a, b in zip(loaded, jax.tree.leaves(original), strict=True)
        )
    finally:
        await runner.cleanup()
        engine.update_weights(original, engine.version)


# --------------------------------------------------------------------- CLI
def test_cli_bad_override_exits_2(capsys):
    assert main(["serve-engine", "--config", TINY_CONFIG, "bad.key=1"]) == 2
    assert "'bad'" in capsys.readouterr().err
    assert main(["serve-engine", "--config", TINY_CONFIG, "--params", "/nonexistent/x"]) == 2
    assert "/nonexistent/x" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["params-dir", "run-dir"], ids=str)
def test_engine_from_config_loads_params(tmp_path, kind):
    cfg = load_config(TINY_CONFIG, TINY_OVERRIDES)
    trained = nnx.state(Transformer(cfg.model, rngs=nnx.Rngs(7)), nnx.Param)
    if kind == "params-dir":
        path = save_params(tmp_path / "params", trained)
        version = 0
    else:
        path, version = tmp_path / "run", 3
        ckpt = Checkpointer(path / "checkpoints")
        opt_state = make_optimizer(cfg.learner.optimizer).init(trained)
        ckpt.save(version, trained, opt_state, {"version": version})
        ckpt.close()
    engine, info = engine_from_config(cfg, str(path))
    assert engine.version == version and info["model_path"] == str(path)
    for a, b in zip(jax.tree.leaves(engine.params), jax.tree.leaves(trained), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


async def test_cli_serve_engine_subprocess():
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tunix_agentic",
        "serve-engine",
        "--config",
        TINY_CONFIG,
        "--port",
        "0",
        "engine.max_slots=2",
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), timeout=20)).decode()
        assert line.startswith("serving on http://127.0.0.1:")
        base = line.split()[-1]
        status, health = await call(base, "/health", method="GET")
        assert status == 200 and health["status"] == "ok"
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), timeout=20) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


# ------------------------------------------------ no request breaks a server
@in_module_loop
@pytest.mark.parametrize(
    "sampling,field",
    [
        ({"top_k": 1099511627776}, "top_k"),
        ({"sampling_seed": 2**70}, "seed"),
        ({"temperature": 1e309}, "temperature"),
        ({"temperature": 10**400}, "temperature"),
        ({"stop_token_ids": [MAX_SEQ * 1000]}, "stop_token_ids"),
        ({"top_p": float("nan")}, "top_p"),
    ],
    ids=[
        "huge_top_k",
        "seed_beyond_64_bits",
        "infinite_temperature",
        "huge_int_temperature",
        "stop_id_beyond_vocab",
        "nan_top_p",
    ],
)
async def test_bad_sampling_values_fail_that_request_only(url, sampling, field):
    """One request's bad parameters get a 400 naming the field; the engine stays up."""
    async with aiohttp.ClientSession() as session:
        body = json.dumps({"input_ids": [3, 1, 4], "sampling_params": sampling}, allow_nan=True)
        async with session.post(
            url + "/generate", data=body, headers={"Content-Type": "application/json"}
        ) as resp:
            assert resp.status == 400, await resp.text()
            assert field in (await resp.json())["error"]["message"]
    status, health = await call(url, "/health", method="GET")
    assert status == 200 and health["status"] == "ok"
    status, out = await call(
        url, "/generate", {"input_ids": [3, 1, 4], "sampling_params": GREEDY_SGLANG}
    )
    assert status == 200 and len(out["output_ids"]) == 4


@in_module_loop
async def test_request_caps_are_400s(url):
    status, out = await call(url, "/generate", {"input_ids": [[1, 2]] * 2000})
    assert status == 400 and "at most" in out["error"]["message"]


@in_module_loop
async def test_engine_rejects_sampling_it_cannot_honour(engine):
    """Called in-process, the engine refuses the request instead of failing its scheduler."""
    with pytest.raises(ValueError, match="top_k"):
        await engine.generate([3, 1, 4], SamplingParams(top_k=2**40))
    out = await engine.generate([3, 1, 4], GREEDY)
    assert engine.health()["ok"] and len(out.token_ids) == GREEDY.max_new_tokens


@in_module_loop
async def test_large_body_is_parsed_off_the_event_loop(url, monkeypatch):
    """While a ~50 MB body is being parsed, /health keeps answering.

    The real parser is wrapped to mark when it runs; the client shares the
    server's event loop, so a parse on the loop would leave no /health answer
    inside that window (the old code's behaviour), whatever the machine's speed.
    """
    from tunix_agentic.serving import http

    parsing = {"now": False, "runs": 0}
    real = http.load_json  # what read_json parses with

    def marked(raw):
        parsing["now"] = True
        parsing["runs"] += 1
        try:
            return real(raw)
        finally:
            parsing["now"] = False

    monkeypatch.setattr(http, "load_json", marked)
    big = json.dumps({"input_ids": [[1] * 1000] * 16000}).encode()  # 16M tokens: over the cap
    assert len(big) > 40_000_000
    answered_while_parsing = 0
    async with aiohttp.ClientSession() as session:
        big_reply = asyncio.ensure_future(
            session.post(url + "/generate", data=big, headers={"Content-Type": "application/json"})
        )
        while not big_reply.done():
            async with session.get(url + "/health") as resp:
                assert resp.status == 200
                if parsing["now"]:
                    answered_while_parsing += 1
            await asyncio.sleep(0)
        resp = await big_reply
        assert resp.status == 400 and "at most" in (await resp.json())["error"]["message"]
        resp.release()
    assert parsing["runs"] >= 1
    assert answered_while_parsing > 0, "no /health answered while the large body was parsed"


@pytest.mark.parametrize(
    "host,ok",
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("192.168.1.5", False),
    ],
    ids=["v4_loopback", "v6_loopback", "localhost", "any", "lan"],
)
def test_serving_beyond_loopback_needs_an_api_key(host, ok):
    from tunix_agentic.serving.engine_server import check_exposure

    check_exposure(host, "key")  # with a key, any address
    if ok:
        check_exposure(host, None)
    else:
        with pytest.raises(ValueError, match="API key"):
            check_exposure(host, None)


def test_cli_refuses_to_serve_beyond_loopback_without_a_key(capsys, monkeypatch):
    monkeypatch.delenv("TUNIX_AGENTIC_API_KEY", raising=False)
    assert main(["serve-engine", "--config", TINY_CONFIG, "--host", "0.0.0.0"]) == 2
    assert "API key" in capsys.readouterr().err


@in_module_loop
async def test_api_key_guards_every_route_but_health(engine, tmp_path):
    runner, port = await start_server(engine, api_key="s3cret", weight_dirs=[tmp_path])
    base = f"http://127.0.0.1:{port}"
    try:
        body = {"input_ids": [3, 1, 4], "sampling_params": GREEDY_SGLANG}
        assert (await call(base, "/health", method="GET"))[0] == 200
        for path, payload, method in [
            ("/generate", body, "POST"),
            ("/get_model_info", None, "GET"),
            ("/abort_request", {"rid": "x"}, "POST"),
            ("/update_weights_from_disk", {"model_path": str(tmp_path)}, "POST"),
        ]:
            status, out = await call(base, path, payload, method=method)
            assert status == 401 and "API key" in out["error"]["message"], path
        async with aiohttp.ClientSession(headers={"Authorization": "Bearer wrong"}) as session:
            async with session.post(base + "/generate", json=body) as resp:
                assert resp.status == 401
        client = SGLangEngine(base, api_key="s3cret")
        try:
            out = await client.generate([3, 1, 4], GREEDY)
            assert len(out.token_ids) == GREEDY.max_new_tokens
        finally:
            await client.close()
    finally:
        await runner.cleanup()


@in_module_loop
async def test_weights_load_only_from_directories_named_at_start(engine, tmp_path):
    allowed, elsewhere = tmp_path / "allowed", tmp_path / "elsewhere"
    params = engine.params
    save_params(elsewhere / "v1", params)
    save_params(allowed / "v1", params)
    (allowed / "escape").symlink_to(elsewhere)
    runner, port = await start_server(engine, weight_dirs=[allowed])
    base = f"http://127.0.0.1:{port}"
    try:
        for path in (
            elsewhere / "v1",
            allowed / ".." / "elsewhere" / "v1",
            allowed / "escape" / "v1",
        ):
            status, out = await call(base, "/update_weights_from_disk", {"model_path": str(path)})
            assert status == 403 and out["success"] is False, path
        version = engine.version
        status, out = await call(
            base, "/update_weights_from_disk", {"model_path": str(allowed / "v1")}
        )
        assert status == 200 and out["success"] and out["weight_version"] == str(version + 1)
    finally:
        await runner.cleanup()
    runner, port = await start_server(engine)  # no directory named: nothing loads
    try:
        status, out = await call(
            f"http://127.0.0.1:{port}",
            "/update_weights_from_disk",
            {"model_path": str(allowed / "v1")},
        )
        assert status == 403 and "none was named" in out["message"]
    finally:
        await runner.cleanup()


@in_module_loop
async def test_a_run_waits_for_a_server_that_is_not_up_yet_to_load_its_weights(
    engine, tmp_path_factory
):
    """The trainer hands its starting weights to its engine servers and waits until they
    hold them; one not listening yet (a Ray actor restarting) is asked again until it
    is, not the end of the run."""
    from tunix_agentic.inference.pool import EnginePool
    from tunix_agentic.metrics.recorder import MetricsRecorder
    from tunix_agentic.trainer import _give_weights

    class Learner:  # what _give_weights asks of the learner: its policy's weights
        def params_for_engine(self):
            return nnx.state(tiny_model(seed=3), nnx.Param)

    port = free_port()
    weights = tmp_path_factory.mktemp("starting-weights")
    pool = EnginePool([SGLangEngine(f"http://127.0.0.1:{port}", weights_dir=str(weights))])
    later = None

    async def come_up():  # the server starts listening 2 s after the trainer first asks
        nonlocal later
        await asyncio.sleep(2.0)
        later, _ = await start_server(engine, port=port, weight_dirs=[weights])

    starting = asyncio.ensure_future(come_up())
    version = engine.version + 1
    try:
        await _give_weights([pool], Learner(), version, MetricsRecorder(None), wait_s=60.0)
        assert engine.version == version  # the server loaded them once it was up
        dead = EnginePool([SGLangEngine(f"http://127.0.0.1:{free_port()}")])
        try:  # none comes up within wait_s: the run cannot sample its own policy
            with pytest.raises(ConfigError, match="could not load the run's weights"):
                await _give_weights([dead], Learner(), version, MetricsRecorder(None), wait_s=0.0)
        finally:
            await dead.close()
    finally:
        await starting
        await pool.close()
        if later is not None:
            await later.cleanup()
