import asyncio

import pytest
from flax import nnx

from tunix_agentic.inference import EngineConfig, JaxEngine, SamplingParams
from tunix_agentic.inference.cross_policy import CrossPolicyEngine
from tunix_agentic.testing import tiny_model

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=4)


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=4)


def _engines(model, n=2):
    return [
        JaxEngine(model, EngineConfig(max_slots=4, max_seq_len=32, decode_steps=4))
        for _ in range(n)
    ]


async def test_actions_come_from_fresh_and_stale_engines(model):
    pool = CrossPolicyEngine(_engines(model), fresh_fraction=0.5, seed=1)
    outs = await asyncio.gather(*(pool.generate([1, 2, 3], GREEDY) for _ in range(40)))
    assert all(len(o.token_ids) == 4 for o in outs)
    assert pool.picks[0] > 5 and pool.picks[1] > 5 and sum(pool.picks) == 40
    await pool.close()


async def test_stale_engines_update_only_every_k_versions(model):
    fresh, stale = _engines(model)
    pool = CrossPolicyEngine([fresh, stale], stale_every=3, fresh_fraction=1.0)
    params = nnx.state(model, nnx.Param)
    for version in range(1, 5):
        assert await asyncio.wait_for(pool.update_weights(params, version), 30) == version
        assert fresh.version == version  # resolved: every engine that got them applied them
        assert stale.version == (3 if version >= 3 else 0)
    out = await pool.generate([1, 2], GREEDY)
    assert set(out.versions) == {4}  # fresh_fraction 1.0: always the newest policy
    await pool.close()


@pytest.mark.parametrize(
    "kwargs,match",
    [(dict(stale_every=0), "stale_every"), (dict(fresh_fraction=1.5), "fresh_fraction")],
    ids=["stale_every", "fresh_fraction"],
)
def test_bad_arguments(model, kwargs, match):
    with pytest.raises(ValueError, match=match):
        CrossPolicyEngine(_engines(model), **kwargs)
    with pytest.raises(ValueError, match="at least two"):
        CrossPolicyEngine(_engines(model, 1))
