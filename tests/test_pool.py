"""EnginePool over real tiny JaxEngines.

Faults are real too: a dead backend is a JaxEngine that has been closed, and
:class:`FaultInjectedEngine` is a real JaxEngine with faults switched on and
off by the test (an outage, or a door that holds requests back). Compiling an
engine costs seconds on CPU, so three warm engines are shared by the module
(one event loop for all tests); pools over them are made with
``close_backends=False``.
"""

import asyncio

import jax
import numpy as np
import pytest
import pytest_asyncio
from flax import nnx

from tunix_agentic.inference import (
    EngineConfig,
    EngineError,
    JaxEngine,
    PromptTooLongError,
    WeightUpdate,
)
from tunix_agentic.inference.params import SamplingParams
from tunix_agentic.inference.pool import EnginePool
from tunix_agentic.metrics import MetricsRecorder
from tunix_agentic.testing import tiny_model

pytestmark = pytest.mark.asyncio(loop_scope="module")

CONFIG = EngineConfig(max_slots=4, max_seq_len=128, decode_steps=2)
SHORT = SamplingParams(temperature=0.0, max_new_tokens=9)
LONG = SamplingParams(temperature=0.0, max_new_tokens=100)


class FaultInjectedEngine(JaxEngine):
    """A real JaxEngine with injected faults, off until a test switches them on.

    While ``down``: ``generate`` and ``update_weights`` raise ``EngineError``,
    as an unreachable server would, and ``check_health`` answers False.
    While ``gate`` is an unset Event, ``generate`` waits at the door before it
    reaches the engine: a stuck backend.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.down = False
        self.gate: asyncio.Event | None = None

    async def generate(
        self, prompt_ids, sampling=SamplingParams(), *, session_id=None, request_id=None
    ):
        if self.gate is not None:
            await self.gate.wait()
        if self.down:
            raise EngineError("injected fault: backend unreachable")
        return await super().generate(
            prompt_ids, sampling, session_id=session_id, request_id=request_id
        )

    def update_weights(self, params, version):
        if self.down:
            raise EngineError("injected fault: backend unreachable")
        return super().update_weights(params, version)

    async def check_health(self) -> bool:
        return not self.down and not self._closed


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=3)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engines(model):
    """Two JaxEngines and a FaultInjectedEngine, compiled for 1- and 4-row prefills."""
    engines = [
        JaxEngine(model, CONFIG),
        JaxEngine(model, CONFIG),
        FaultInjectedEngine(model, CONFIG),
    ]

    async def warm(engine):
        await engine.generate([1, 2, 3], SHORT)
        await asyncio.gather(*(engine.generate([4, 5, i], SHORT) for i in range(4)))

    await asyncio.gather(*(warm(e) for e in engines))
    yield engines
    for e in engines:
        await e.close()


@pytest.fixture(autouse=True)
def no_faults_left(engines):
    yield
    engines[2].down = False
    engines[2].gate = None


@pytest_asyncio.fixture(loop_scope="module")
async def make_pool():
    pools = []

    def make(backends, **kwargs):
        pool = EnginePool(backends, close_backends=False, **kwargs)
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        await pool.close()


async def closed_engine(model) -> JaxEngine:
    engine = JaxEngine(model, CONFIG)
    await engine.close()
    return engine


def column(pool: EnginePool, key: str) -> list:
    return [b[key] for b in pool.health()["backends"]]


def landed(pool: EnginePool, served_before: list[int]) -> int:
    """The index of the one backend whose served count went up."""
    moved = [
        i
        for i, (a, b) in enumerate(zip(served_before, column(pool, "served"), strict=True))
        if b > a
    ]
    assert len(moved) == 1, moved
    return moved[0]


def assert_heap_consistent(pool: EnginePool) -> None:
    """Each backend has exactly one live heap entry, and it holds its live count."""
    for b in pool._backends:
        live = [e for e in pool._router.heap if e[2] == b.index and e[1] == b.stamp]
        assert live == [(b.in_flight, b.stamp, b.index)]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(backends=[]), "backends"),
        (dict(names=["a", "b"]), "names"),
        (dict(max_attempts=0), "max_attempts"),
        (dict(failures_to_eject=0), "failures_to_eject"),
        (dict(health_interval_s=0.0), "health_interval_s"),
        (dict(request_timeout_s=-1.0), "request_timeout_s"),
    ],
    ids=["no-backends", "names", "max_attempts", "failures_to_eject", "interval", "timeout"],
)
async def test_bad_settings_get_clear_errors(engines, kwargs, match):
    kwargs = {"backends": engines[:1], **kwargs}
    with pytest.raises(ValueError, match=match):
        EnginePool(kwargs.pop("backends"), **kwargs)


async def test_concurrent_requests_spread_evenly_and_counts_return_to_zero(engines, make_pool):
    pool = make_pool(engines)
    before = [e.stats["generated_tokens"] for e in engines]
    sampling = SamplingParams(temperature=0.0, max_new_tokens=40)
    outs = await asyncio.gather(*(pool.generate([7, i + 1], sampling) for i in range(9)))
    assert all(len(o.token_ids) == 40 for o in outs)
    assert column(pool, "served") == [3, 3, 3]
    # The engines themselves did the work the pool says it sent them.
    assert [e.stats["generated_tokens"] - b for e, b in zip(engines, before, strict=True)] == [
        120
    ] * 3
    assert column(pool, "in_flight") == [0, 0, 0] and pool.in_flight == 0
    assert_heap_consistent(pool)


async def test_a_backend_busy_with_a_stuck_request_gets_no_new_work(engines, make_pool):
    stuck = engines[2]
    stuck.gate = asyncio.Event()
    pool = make_pool([stuck, engines[0], engines[1]])
    held = asyncio.create_task(pool.generate([1, 2], SHORT))
    await asyncio.sleep(0)  # routed (to the first backend on a tie) and now waiting at the door
    assert column(pool, "in_flight") == [1, 0, 0]
    for i in range(4):
        await pool.generate([3, i + 1], SHORT)
    # Finished requests took their counts down with them; a heap that only ever
    # increments would rate all three backends at 1 by now and use the stuck one.
    assert column(pool, "served") == [0, 2, 2]
    assert column(pool, "in_flight") == [1, 0, 0]
    stuck.gate.set()
    assert len((await held).token_ids) == 9
    assert column(pool, "served") == [1, 2, 2] and column(pool, "in_flight") == [0, 0, 0]
    assert_heap_consistent(pool)


async def test_in_flight_counts_match_the_engines_mid_flight(engines, make_pool):
    metrics = MetricsRecorder(None)
    pool = make_pool(engines, metrics=metrics)
    before = [e.stats["generated_tokens"] for e in engines]
    tasks = [asyncio.create_task(pool.generate([9, i + 1], LONG)) for i in range(12)]
    await asyncio.sleep(0)
    assert column(pool, "in_flight") == [4, 4, 4] and pool.in_flight == 12
    # Wait until every engine has prefilled its four and run a decode chunk.
    async with asyncio.timeout(30):
        while any(
            e.stats["generated_tokens"] - b <= 4 for e, b in zip(engines, before, strict=True)
        ):
            await asyncio.sleep(0.001)
    assert column(pool, "in_flight") == [e.in_flight for e in engines] == [4, 4, 4]
    assert_heap_consistent(pool)
    outs = await asyncio.gather(*tasks)
    assert all(len(o.token_ids) == 100 for o in outs)
    assert column(pool, "in_flight") == [e.in_flight for e in engines] == [0, 0, 0]
    written = metrics.write_step(0)
    assert written["gauge/pool/in_flight"] == 0 and written["gauge/pool/in_flight_max"] == 12
    assert written["count/pool/requests_total"] == 12


async def test_a_session_sticks_to_its_backend(engines, make_pool):
    pool = make_pool(engines[:2])
    prompt, homes = [1, 2, 3, 4], []
    for turn in range(3):
        before = column(pool, "served")
        out = await pool.generate(prompt, SHORT, session_id="episode-a")
        homes.append(landed(pool, before))
        if turn:
            assert out.cached_tokens > 0  # the same backend still held the session's KV cache
        prompt = prompt + out.token_ids + [40 + turn]
    # Without stickiness the tie-break would alternate backends turn by turn.
    assert homes == [homes[0]] * 3
    before = column(pool, "served")
    await pool.generate([1, 2, 3, 4], SHORT, session_id="episode-b")
    assert landed(pool, before) != homes[0]


async def test_a_session_moves_when_its_backend_fails_and_stays_moved(engines, make_pool):
    flaky = engines[2]
    pool = make_pool([flaky, engines[0]], failures_to_eject=1)
    before = column(pool, "served")
    await pool.generate([1, 2], SHORT, session_id="episode-c")
    assert landed(pool, before) == 0
    flaky.down = True
    before = column(pool, "served")
    await pool.generate([1, 2, 3], SHORT, session_id="episode-c")
    assert landed(pool, before) == 1 and column(pool, "healthy") == [False, True]
    flaky.down = False
    assert await pool.check_health()
    assert column(pool, "healthy") == [True, True]
    before = column(pool, "served")
    await pool.generate([1, 2, 3, 4], SHORT, session_id="episode-c")
    assert landed(pool, before) == 1  # re-pinned; the least-loaded tie-break would pick 0


async def test_requests_fail_over_from_a_dead_backend_and_none_is_lost(model, engines, make_pool):
    metrics = MetricsRecorder(None)
    dead, live = await closed_engine(model), engines[0]
    pool = make_pool([dead, live], names=["dead", "live"], metrics=metrics)
    first = await pool.generate([2, 1], SHORT)
    assert column(pool, "failures") == [1, 0] and column(pool, "healthy") == [True, True]
    second = await pool.generate([2, 2], SHORT)
    assert column(pool, "healthy") == [False, True]  # ejected at failures_to_eject=2
    rest = await asyncio.gather(*(pool.generate([2, i + 3], SHORT) for i in range(8)))
    outs = [first, second, *rest]
    for o in outs:
        assert len(o.token_ids) == len(o.logprobs) == len(o.versions) == 9
        assert o.finish_reason == "length"
    assert first.token_ids == (await live.generate([2, 1], SHORT)).token_ids
    assert column(pool, "served") == [0, 10] and column(pool, "in_flight") == [0, 0]
    written = metrics.write_step(0)
    assert written["count/pool/requests_total"] == 10
    assert written["count/pool/failovers_total"] == 2
    assert written["count/pool/ejections_total"] == 1


async def test_a_bad_request_propagates_and_blames_no_backend(engines, make_pool):
    metrics = MetricsRecorder(None)
    pool = make_pool(engines[:2], failures_to_eject=1, metrics=metrics)
    with pytest.raises(ValueError, match="token ids"):
        await pool.generate([1, 999], SHORT)
    with pytest.raises(PromptTooLongError):
        await pool.generate([1] * 128, SHORT)
    assert column(pool, "healthy") == [True, True]
    assert column(pool, "failures") == [0, 0] and column(pool, "in_flight") == [0, 0]
    assert "count/pool/failovers_total" not in metrics.write_step(0)
    assert len((await pool.generate([1, 2], SHORT)).token_ids) == 9


async def test_an_ejected_backend_is_probed_back_into_rotation(engines, make_pool):
    metrics = MetricsRecorder(None)
    flaky = engines[2]
    flaky.down = True
    pool = make_pool([flaky, engines[0]], health_interval_s=0.02, metrics=metrics)
    for i in range(3):
        assert len((await pool.generate([3, i + 1], SHORT)).token_ids) == 9
    assert column(pool, "healthy") == [False, True]
    await asyncio.sleep(0.1)  # several failed probes: it stays out while it is down
    assert column(pool, "healthy") == [False, True]
    flaky.down = False
    async with asyncio.timeout(10):
        while not column(pool, "healthy")[0]:
            await asyncio.sleep(0.01)
    await asyncio.gather(pool.generate([3, 7], SHORT), pool.generate([3, 8], SHORT))
    assert column(pool, "served") == [1, 4] and column(pool, "failures") == [0, 0]
    written = metrics.write_step(0)
    assert (
        written["count/pool/ejections_total"] == 1 and written["count/pool/recoveries_total"] == 1
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(failures_to_eject=1), r"no healthy backend left \(2 of 2 out of rotation"),
        (dict(failures_to_eject=2), r"no healthy backend left \(0 of 2 out of rotation"),
        (dict(max_attempts=1), "request failed on all max_attempts=1 attempts"),
    ],
    ids=["all-ejected", "all-tried", "attempts-spent"],
)
async def test_all_backends_dead_raises_a_clear_error(model, make_pool, kwargs, match):
    pool = make_pool([await closed_engine(model), await closed_engine(model)], **kwargs)
    with pytest.raises(EngineError, match=match) as info:
        await asyncio.wait_for(pool.generate([1, 2], SHORT), timeout=10)
    assert "engine is closed" in str(info.value)
    assert pool.in_flight == 0


async def test_a_pool_with_every_backend_ejected_fails_fast(model, make_pool):
    pool = make_pool([await closed_engine(model)], failures_to_eject=1)
    assert not await pool.check_health()
    with pytest.raises(EngineError, match=r"no healthy backend left \(1 of 1"):
        await asyncio.wait_for(pool.generate([1, 2], SHORT), timeout=10)
    assert not pool.health()["ok"]


async def test_update_weights_reaches_every_backend_and_stale_ones_catch_up(
    model, engines, make_pool
):
    dead, flaky = await closed_engine(model), engines[2]
    pool = make_pool([engines[0], flaky, dead], failures_to_eject=1, health_interval_s=0.02)
    assert await pool.check_health()  # probes everyone: the closed engine is taken out
    assert column(pool, "healthy") == [True, True, False]
    params = nnx.state(model, nnx.Param)

    with pytest.raises(ValueError, match="does not match"):
        pool.update_weights(jax.tree.map(lambda x: np.zeros(1, np.float32), params), version=99)
    assert column(pool, "healthy") == [True, True, False]  # bad params blame nobody

    recorded = column(pool, "version")
    version = engines[0].version + 1
    flaky.down = True
    update = pool.update_weights(params, version)
    assert pool.health()["version"] == version
    assert column(pool, "healthy") == [True, False, False]  # it missed the update: out of rotation
    assert dead.pending_version is None  # out of rotation: offered nothing (readmission would)
    assert await asyncio.wait_for(update, 10) == version  # applied by the one that could
    assert column(pool, "version") == [version, *recorded[1:]]  # recorded only where applied
    assert engines[0].version == version
    out = await pool.generate([5, 6], SHORT)
    assert out.versions == [version] * 9

    flaky.down = False
    async with asyncio.timeout(10):
        while not column(pool, "healthy")[1]:
            await asyncio.sleep(0.01)
    assert column(pool, "version") == [version, version, recorded[2]]  # closed: never applied
    outs = await asyncio.gather(pool.generate([5, 7], SHORT), pool.generate([5, 8], SHORT))
    assert column(pool, "served")[1] == 1
    assert flaky.version == version  # it came back with the new weights, not its old ones
    assert all(o.versions == [version] * 9 for o in outs)


async def test_cancelling_a_caller_takes_its_count_down(engines, make_pool):
    pool = make_pool(engines[:2])
    before = engines[0].stats["generated_tokens"]
    task = asyncio.create_task(pool.generate([1, 2], LONG))
    async with asyncio.timeout(30):
        while engines[0].stats["generated_tokens"] - before < 2:
            await asyncio.sleep(0.001)
    assert column(pool, "in_flight") == [1, 0]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert column(pool, "in_flight") == [0, 0] and pool.in_flight == 0
    assert_heap_consistent(pool)
    async with asyncio.timeout(30):
        while engines[0].in_flight:  # the engine aborted the request too
            await asyncio.sleep(0.001)


async def test_a_request_timeout_fails_over_to_another_backend(engines, make_pool):
    stuck = engines[2]
    stuck.gate = asyncio.Event()
    pool = make_pool(
        [stuck, engines[0]], request_timeout_s=1.0, failures_to_eject=1, health_interval_s=60.0
    )
    out = await pool.generate([4, 5], SHORT)
    assert len(out.token_ids) == 9
    assert column(pool, "healthy") == [False, True]
    assert column(pool, "served") == [0, 1] and column(pool, "in_flight") == [0, 0]


async def test_close_stops_the_health_task_and_closes_owned_backends(model):
    engine = JaxEngine(model, CONFIG)  # never generates, so never compiles
    pool = EnginePool([engine], health_interval_s=0.01)
    with pytest.raises(ValueError, match="empty"):
        await pool.generate([], SHORT)  # a bad request, but it starts the health task
    assert any(t.get_name() == "engine-pool-health" for t in asyncio.all_tasks())
    await pool.close()
    assert not any(t.get_name() == "engine-pool-health" for t in asyncio.all_tasks())
    assert engine.health()["ok"] is False
    with pytest.raises(EngineError, match="closed"):
        await pool.generate([1, 2], SHORT)


class LateFailingEngine(JaxEngine):
    """Accepts an update, then fails it after a while, as a server that cannot load it."""

    def update_weights(self, params, version):
        super().update_weights(params, version)
        update = WeightUpdate(version)
        asyncio.get_running_loop().call_later(
            0.05, update.set_failed, EngineError("injected: the server could not load them")
        )
        return update


async def test_an_update_that_fails_later_ejects_its_backend_and_records_nothing(model, engines):
    late = LateFailingEngine(model, CONFIG)
    pool = EnginePool([engines[0], late], names=["good", "late"], close_backends=False)
    recorded = column(pool, "version")
    version = engines[0].version + 1
    update = pool.update_weights(nnx.state(model, nnx.Param), version)
    assert column(pool, "healthy") == [True, True]  # accepted: nothing known yet
    assert await asyncio.wait_for(update, 10) == version  # the good one applied them
    async with asyncio.timeout(10):  # the late failure is observed in the background
        while column(pool, "healthy")[1]:
            await asyncio.sleep(0.01)
    assert column(pool, "version") == [version, recorded[1]]
    await pool.close()
    await late.close()


async def test_an_update_no_backend_applied_raises(model):
    dead = await closed_engine(model)
    pool = EnginePool([dead], close_backends=False)
    update = pool.update_weights(nnx.state(model, nnx.Param), 7)
    with pytest.raises(EngineError, match="applied by no backend.*engine is closed"):
        await asyncio.wait_for(update, 10)
    assert not pool.health()["ok"]
    await pool.close()


class HungUpdateEngine(JaxEngine):
    """Accepts weight updates and never applies them (a server stuck loading)."""

    def update_weights(self, params, version):
        return WeightUpdate(version)


async def test_a_backend_stuck_on_an_update_does_not_hold_the_learner(model, engines):
    stuck = HungUpdateEngine(model, CONFIG)
    pool = EnginePool([engines[0], stuck], names=["good", "stuck"], close_backends=False)
    version = engines[0].version + 1
    update = pool.update_weights(nnx.state(model, nnx.Param), version)
    assert await asyncio.wait_for(update, 10) == version  # the first application resolves it
    assert column(pool, "version")[0] == version and column(pool, "healthy") == [True, True]
    await asyncio.wait_for(pool.close(), 30)  # the stuck settle is given up, not awaited forever
    await stuck.close()


async def test_waiting_on_an_update_can_be_abandoned_without_cancelling_it(model, make_engine):
    engine = make_engine(model, CONFIG)
    update = engine.update_weights(nnx.state(model, nnx.Param), 3)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(update, 0)  # a waiter gives up at once
    assert await asyncio.wait_for(update, 10) == 3  # the update itself went on
    assert engine.pending_version is None
