"""The run's engine by ``engine.backend`` (``run_setup.build_engine``'s factory table), the
JAX engines behind it, and the tokenizer offered through the engine protocol."""

from __future__ import annotations

import dataclasses

import pytest

from tunix_agentic.config import ConfigError, RunConfig
from tunix_agentic.inference.base import ServerClient
from tunix_agentic.inference.config import ENGINE_BACKENDS, EngineConfig
from tunix_agentic.inference.cross_policy import CrossPolicyEngine
from tunix_agentic.inference.engine import JaxEngine
from tunix_agentic.inference.pool import EnginePool
from tunix_agentic.models.char_tokenizer import CharTokenizer
from tunix_agentic.run_setup import ENGINE_FACTORIES, build_engine, in_process_engines
from tunix_agentic.serving.client import SGLangEngine
from tunix_agentic.serving.vllm_client import VLLMEngine
from tunix_agentic.testing import tiny_model

SERVERS = ("http://127.0.0.1:9001", "http://127.0.0.1:9002")


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def test_every_backend_has_a_factory():
    assert set(ENGINE_FACTORIES) == set(ENGINE_BACKENDS)


@pytest.mark.parametrize(
    "backend, client, shaped",
    [
        ("sglang", SGLangEngine, True),  # SGLang's API: weights as safetensors
        ("vllm", VLLMEngine, True),
        ("jax", SGLangEngine, False),  # serve-engine processes: our checkpoints
    ],
    ids=["sglang", "vllm", "jax_served"],
)
async def test_servers_become_a_pool_of_the_backends_clients(model, backend, client, shaped):
    engine_cfg = EngineConfig(backend=backend, urls=SERVERS if backend != "jax" else ())
    config = RunConfig(engine=engine_cfg)
    # The jax backend's servers are the run's Ray engines (or rollout.service.engine_urls).
    engine = build_engine(config, model, 0, engine_urls=SERVERS if backend == "jax" else ())
    try:
        assert isinstance(engine, EnginePool) and in_process_engines(engine) == []
        assert [type(b) for b in engine.backends] == [client, client]
        assert all(isinstance(b, ServerClient) for b in engine.backends)
        assert [b.base_url for b in engine.backends] == list(SERVERS)
        assert all((b.model_cfg is not None) == shaped for b in engine.backends)
    finally:
        await engine.close()


@pytest.mark.parametrize("backend", ["sglang", "vllm"], ids=str)
def test_a_server_backend_without_servers_is_refused(model, backend):
    config = RunConfig(engine=EngineConfig(backend=backend))
    with pytest.raises(ConfigError, match=f"engine.backend={backend} .* engine.urls"):
        build_engine(config, model, 0)


async def test_in_process_engines_and_the_first_tokenizer_offered(model):
    small = EngineConfig(max_slots=2, max_seq_len=64)
    one = build_engine(RunConfig(engine=small), model, 3)
    assert isinstance(one, JaxEngine) and in_process_engines(one) == [one]
    await one.close()
    config = RunConfig(engine=small)
    config = dataclasses.replace(
        config, cross_policy=dataclasses.replace(config.cross_policy, stale_engines=1)
    )
    mix = build_engine(config, model, 3)
    try:
        assert isinstance(mix, CrossPolicyEngine)
        members = in_process_engines(mix)
        assert members == mix.engines and len(members) == 2
        first, second = CharTokenizer(model.cfg.vocab_size), CharTokenizer(model.cfg.vocab_size)
        mix.use_tokenizer(first)  # offered to every engine of the mix
        mix.use_tokenizer(second)  # a later offer (a server mounted on them) changes nothing
        assert [m.grammars.tokenizer for m in members] == [first, first]
    finally:
        await mix.close()
