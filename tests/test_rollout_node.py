"""The rollout node (``serve-rollout``) as a real process over a real engine server.

One tiny ``serve-engine`` process serves the module; the node runs the calculator recipe
(tiny overrides) and, for cancellation tests, the ``marker`` environment of
tests/rollout_node_envs.py, whose episodes leave a file until they are closed.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from tunix_agentic.envs.base import Task
from tunix_agentic.rollout.client.node_client import GroupConflict, NodeClient
from tunix_agentic.rollout.episode import Group
from tunix_agentic.rollout.service.admin import local_token
from tunix_agentic.rollout.service.wal import FinalRecord, GroupLog
from tunix_agentic.rollout.wire import (
    GroupRequest,
    SamplingSpec,
    SeedSpec,
    TaskRef,
    group_from_json,
    group_to_json,
    trajectory_from_json,
    trajectory_to_json,
)
from tunix_agentic.testing import (
    TINY_MODEL_OVERRIDES,
    TINY_RUN_OVERRIDES,
    cli,
    spawn_server,
    stop_server,
)
from tunix_agentic.trajectory import Step, Trajectory

REPO = Path(__file__).resolve().parents[1]
CONFIG = str(REPO / "configs" / "calculator_tiny.yaml")
ENGINE_OVERRIDES = [*TINY_MODEL_OVERRIDES, "engine.max_seq_len=128", "engine.decode_steps=2"]
# Two groups run at once (--max-groups 2 on the shared node), the rest wait.
NODE_OVERRIDES = [
    *TINY_RUN_OVERRIDES,
    "rollout.run_workers=4",
    "rollout.infra_backoff_s=0",
    "rollout.infra_backoff_max_s=0",
    f"env.import={REPO / 'tests' / 'rollout_node_envs.py'}",
]
QUICK = SamplingSpec(max_tokens=8)
BOUND_S = 120  # a bound against hangs, never a timing assertion


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TUNIX_AGENTIC_API_KEY"}
    return {**env, "JAX_PLATFORMS": "cpu", **extra}


def spawn_node(state_dir: Path, *args: str, **env: str) -> tuple[subprocess.Popen, str]:
    argv = cli("serve-rollout", "--config", CONFIG, "--port", "0", "--state-dir", str(state_dir))
    argv = [*argv, *args, *NODE_OVERRIDES]
    return spawn_server(argv, "serving rollout node on ", env=env, timeout_s=BOUND_S)


@pytest.fixture(scope="module")
def engine_url():
    argv = cli("serve-engine", "--config", CONFIG, "--port", "0", *ENGINE_OVERRIDES)
    proc, url = spawn_server(argv, "serving on ", timeout_s=BOUND_S)
    yield url
    stop_server(proc)


@pytest.fixture(scope="module")
def node_url(engine_url, tmp_path_factory):
    proc, url = spawn_node(
        tmp_path_factory.mktemp("node"), "--engine-url", engine_url, "--max-groups", "2"
    )
    yield url
    stop_server(proc)


@pytest.fixture
def markers(tmp_path) -> Path:
    d = tmp_path / "markers"
    d.mkdir()
    return d


def ref_request(group_id: str, index: int = 3, **fields) -> GroupRequest:
    return GroupRequest(
        group_id=group_id,
        num_samples=2,
        task_ref=TaskRef("arithmetic", "train", index),
        sampling=QUICK,
        max_turns=1,
        seed=SeedSpec(run_seed=7, index=index),
        **fields,
    )


def marker_request(group_id: str, markers: Path, hang: list[int], **fields) -> GroupRequest:
    fields.setdefault("num_samples", 2)
    return GroupRequest(
        group_id=group_id,
        task=Task(task_id=group_id, prompt="Compute 1+1."),
        env="marker",
        env_kwargs={"marker_dir": str(markers), "hang": hang},
        sampling=QUICK,
        max_turns=1,
        **fields,
    )


async def until(predicate, what: str) -> None:
    async with asyncio.timeout(BOUND_S):
        while not await predicate():
            await asyncio.sleep(0.05)


# ---------------------------------------------------------------------- wire
def _trajectory() -> Trajectory:
    t = Trajectory(task_id="t", episode_id="g0-t-1", task_name="calc", group_id="g0-t")
    t.append_prompt([5, 6, 7])
    t.append_action(
        Step(
            context_len=3,
            action_ids=[8, 9],
            logprobs=[-(0.1 + 0.2), -1e-300],
            versions=[3, 4],
            finish_reason="stop",
            action_text="<tool_call>x</tool_call>",
            tool_calls=[{"name": "calc", "arguments": {"expression": "1+1"}}],
            timings={"model_s": 0.25},
            reward=0.5,
        )
    )
    t.append_observation([10, 11])
    t.append_action(Step(5, [12], [-2.718281828459045], [4], "length", context_ids=[1, 2, 3, 4, 5]))
    t.reward, t.status, t.error = 1.0, "max_tokens", "cut"
    t.timings, t.info = {"episode_s": 1.5}, {"traceback": "...", "n": [1, 2]}
    return t


def test_trajectories_and_groups_round_trip_exactly():
    t = _trajectory()
    back = trajectory_from_json(json.loads(json.dumps(trajectory_to_json(t))))
    assert back == t
    assert back.steps[0].logprobs[0] == -(0.1 + 0.2)  # the float itself, bit for bit
    g = Group("g0-t", 0, Task("t", "Compute 1+1.", "2", {"a": 1}), 4, [t], [_trajectory()], 1)
    assert group_from_json(json.loads(json.dumps(group_to_json(g)))) == g


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"num_samples": 2, "task_ref": {"source": "arithmetic", "index": 0}}, "group_id"),
        (
            {"group_id": "a", "num_samples": 0, "task_ref": {"source": "s", "index": 0}},
            "num_samples",
        ),
        ({"group_id": "a", "num_samples": 2}, "task"),
        (
            {"group_id": "a", "num_samples": 2, "task_ref": {"source": "s", "index": -1}},
            "task_ref.index",
        ),
        (
            {"group_id": "a", "num_samples": 2, "task_ref": {"source": "s", "index": 0}, "x": 1},
            "request.x",
        ),
        (
            {
                "group_id": "a",
                "num_samples": 2,
                "task_ref": {"source": "s", "index": 0},
                "sampling": {"top_p": 2},
            },
            "sampling.top_p",
        ),
        (
            {
                "group_id": "a",
                "num_samples": 2,
                "task_ref": {"source": "s", "index": 0},
                "min_usable": 3,
            },
            "min_usable",
        ),
    ],
    ids=[
        "no-id",
        "zero-samples",
        "no-task",
        "negative-index",
        "unknown-key",
        "top-p",
        "min-usable",
    ],
)
def test_a_bad_request_names_its_field(body, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        GroupRequest.from_json(body)


def test_a_request_body_is_canonical():
    req = ref_request("g", priority=2, timeout_s=30.0, min_usable=1)
    assert GroupRequest.from_json(json.loads(json.dumps(req.to_json()))) == req


# ----------------------------------------------------------------------- wal
async def test_the_log_cuts_a_torn_last_line_and_reports_unfinished(tmp_path):
    log = GroupLog(tmp_path)
    assert log.open().finals == []
    await log.accepted("a", {"x": 1})
    await log.finished(FinalRecord("a", "done", 1, {"group": None}))
    await log.accepted("b", {"x": 2})
    log.close()
    whole = log.path.read_bytes()
    with open(log.path, "ab") as f:
        f.write(b'{"kind": "final", "group_id": "b", "sta')  # a kill mid-write
    replay = GroupLog(tmp_path).open()
    assert [(r.group_id, r.status, r.cursor) for r in replay.finals] == [("a", "done", 1)]
    assert replay.unfinished == ["b"] and replay.bodies["b"] == {"x": 2}
    assert replay.torn_bytes > 0 and log.path.read_bytes() == whole


async def test_the_log_refuses_a_bad_line_before_the_end(tmp_path):
    (tmp_path / "groups.wal").write_text('{"kind": "accepted"\n{"kind": "x"}\n')
    with pytest.raises(ValueError, match="line 1"):
        GroupLog(tmp_path).open()


# ---------------------------------------------------------------------- node
async def test_a_group_comes_back_token_exact_and_resubmitting_is_idempotent(node_url):
    async with NodeClient(node_url) as node:
        status = await node.status()
        assert status["jax_loaded"] is False  # a rollout node needs no JAX
        assert [e["url"] for e in status["engines"]]
        req = ref_request("exact-1")
        assert await node.submit(req) in ("queued", "running")
        group = await node.wait("exact-1", BOUND_S)
        assert isinstance(group, Group) and len(group.trajectories) == 2
        answer = await node.get("exact-1")
        assert answer["status"] == "done" and group_from_json(answer["group"]) == group
        for member, traj in zip(answer["members"], group.trajectories, strict=True):
            arrays, p = traj.learner_arrays(), traj.prompt_len
            assert member["prompt_ids"] + member["response_ids"] == traj.token_ids
            assert member["loss_mask"] == arrays["loss_mask"][p:].tolist()
            assert member["logprobs"] == [float(x) for x in arrays["old_logprobs"][p:]]
            assert member["versions"] == arrays["versions"][p:].tolist()
            assert member["logprobs"][0] == traj.steps[0].logprobs[0]
        assert await node.submit(req) == "done"  # same id, same body: the same answer
        with pytest.raises(GroupConflict):
            await node.submit(ref_request("exact-1", index=4))
        # Same seeds, another id: the same tokens (the node reproduces a group).
        again = await node.wait((await _resubmitted(node, req, "exact-2")), BOUND_S)
        assert [t.token_ids for t in again.trajectories] == [
            t.token_ids for t in group.trajectories
        ]


async def _resubmitted(node: NodeClient, req: GroupRequest, group_id: str) -> str:
    body = {**req.to_json(), "group_id": group_id}
    await node.submit(GroupRequest.from_json(body))
    return group_id


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (
            {"group_id": "b1", "num_samples": 2, "task_ref": {"source": "nope", "index": 0}},
            "task_ref.source",
        ),
        (
            {
                "group_id": "b2",
                "num_samples": 2,
                "task": {"task_id": "t", "prompt": "p"},
                "env": "marker",
                "env_kwargs": {"sandbox": {}},
            },
            "env_kwargs.sandbox",
        ),
        (
            {"group_id": "b3", "num_samples": "2", "task": {"task_id": "t", "prompt": "p"}},
            "num_samples",
        ),
        (
            {"group_id": "b4", "num_samples": 1, "task": {"type": "os:system", "fields": {}}},
            "task",
        ),
    ],
    ids=["unknown-source", "client-sandbox", "string-count", "foreign-task-type"],
)
async def test_the_node_answers_400_naming_the_field(node_url, body, field):
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{node_url}/v1/groups", json=body) as resp:
            assert resp.status == 400
            assert field in (await resp.json())["error"]["message"]
        async with s.get(f"{node_url}/v1/groups/x?wait_s=-1") as resp:
            assert resp.status in (400, 404)


async def test_long_poll_cursor_and_events(node_url):
    async with NodeClient(node_url) as node, aiohttp.ClientSession() as s:
        start = (await node.done_since(0))["cursor"]
        await node.submit(ref_request("poll-1", index=5))
        answer = await node.get("poll-1", wait_s=BOUND_S)  # answers once final
        assert answer["status"] == "done"
        await node.submit(ref_request("poll-2", index=6))
        await node.wait("poll-2", BOUND_S)
        page = await node.done_since(start)
        ids = [g["group_id"] for g in page["groups"]]
        assert ids.index("poll-1") < ids.index("poll-2")
        assert (await node.done_since(page["cursor"]))["groups"] == []
        first = next(g for g in page["groups"] if g["group_id"] == "poll-1")
        # Events resume after a cursor: from poll-1's, poll-2 comes next (the trainer's
        # groups: read with the admin token the node left for its trainer).
        headers = {"Last-Event-ID": str(first["cursor"])}
        headers["Authorization"] = f"Bearer {local_token(node_url)}"
        async with s.get(f"{node_url}/v1/events", headers=headers) as r:
            assert r.headers["Content-Type"].startswith("text/event-stream")
            event: dict[str, str] = {}
            async with asyncio.timeout(BOUND_S):
                while "data" not in event:
                    key, _, value = (await r.content.readline()).decode().strip().partition(": ")
                    event[key] = value
        assert json.loads(event["data"])["group_id"] == ids[ids.index("poll-1") + 1]


async def test_delete_cancels_running_episodes_and_closes_their_environments(node_url, markers):
    async with NodeClient(node_url) as node:
        await node.submit(marker_request("cancel-1", markers, hang=[0, 1]))

        async def both_hanging():
            return (
                len(list(markers.iterdir())) == 2
                and (await node.get("cancel-1"))["status"] == "running"
            )

        await until(both_hanging, "two episodes in EVAL")
        assert await node.cancel("cancel-1") == "cancelled"
        assert list(markers.iterdir()) == []  # every environment closed
        assert await node.cancel("cancel-1") == "cancelled"  # idempotent
        assert (await node.get("cancel-1"))["status"] == "cancelled"
        # Submitted again (a resumed trainer, a group moved back here): it runs again.
        assert await node.submit(marker_request("cancel-1", markers, hang=[0, 1])) in (
            "queued",
            "running",
        )
        await until(both_hanging, "two episodes in EVAL again")
        assert await node.cancel("cancel-1") == "cancelled"
        assert list(markers.iterdir()) == []


async def test_min_usable_cancels_the_stragglers(node_url, markers):
    async with NodeClient(node_url) as node:
        await node.submit(marker_request("usable-1", markers, hang=[1], min_usable=1))
        group = await node.wait("usable-1", BOUND_S)
        assert len(group.trajectories) == 1 and group.lost == 1
        assert list(markers.iterdir()) == []


async def test_a_group_past_its_timeout_fails(node_url, markers):
    async with NodeClient(node_url) as node:
        await node.submit(marker_request("late-1", markers, hang=[0], num_samples=1, timeout_s=1))
        assert await node.wait("late-1", BOUND_S) == "failed"
        assert "timeout_s" in (await node.get("late-1"))["error"]
        assert list(markers.iterdir()) == []


async def test_higher_priority_runs_first_when_groups_wait(node_url, markers):
    async with NodeClient(node_url) as node:
        for gid in ("block-1", "block-2"):  # both slots held
            await node.submit(marker_request(gid, markers, hang=[0], num_samples=1))
        await node.submit(ref_request("low", index=8, priority=0))
        await node.submit(ref_request("high", index=9, priority=5))
        assert (await node.get("low"))["status"] == "queued"
        await node.cancel("block-1")
        await node.wait("high", BOUND_S)
        await node.cancel("block-2")
        await node.wait("low", BOUND_S)
        cursors = {g: (await node.get(g))["cursor"] for g in ("high", "low")}
        assert cursors["high"] < cursors["low"]


async def test_a_killed_node_serves_finished_groups_again_and_reports_the_rest_lost(
    engine_url, tmp_path, markers
):
    state = tmp_path / "state"
    proc, url = spawn_node(state, "--engine-url", engine_url)
    try:
        async with NodeClient(url) as node:
            await node.submit(ref_request("keep-1"))
            before = await node.get("keep-1", wait_s=BOUND_S)
            assert before["status"] == "done"
            running = marker_request("run-1", markers, hang=[0], num_samples=1)
            await node.submit(running)
            await until(lambda: _has_files(markers), "an episode in EVAL")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        with open(state / "groups.wal", "ab") as f:
            f.write(b'{"kind":"accepted","group_id":"torn"')  # a write the kill cut
        proc, url = spawn_node(state, "--engine-url", engine_url)
        async with NodeClient(url) as node:
            after = await node.get("keep-1")
            assert after["group"] == before["group"] and after["members"] == before["members"]
            assert await node.wait("run-1", BOUND_S) == "lost"
            statuses = {g["group_id"]: g["status"] for g in (await node.done_since(0))["groups"]}
            assert statuses == {"keep-1": "done", "run-1": "lost"}
            assert await node.submit(running) in ("queued", "running")  # resubmitted, runs again
            assert await node.cancel("run-1") == "cancelled"
    finally:
        stop_server(proc)


async def _has_files(d: Path) -> bool:
    return any(d.iterdir())


async def test_api_key_guards_every_route_but_health(engine_url, tmp_path):
    proc, url = spawn_node(tmp_path, TUNIX_AGENTIC_API_KEY="sesame")
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{url}/v1/status") as resp:
                assert resp.status == 401
            async with s.post(f"{url}/v1/groups", json={}) as resp:
                assert resp.status == 401
            async with s.get(f"{url}/health") as resp:
                assert resp.status == 200
        async with NodeClient(url, api_key="sesame") as node:
            assert (await node.status())["jax_loaded"] is False
            await node.add_engine(engine_url)
            assert [e["url"] for e in (await node.status())["engines"]] == [engine_url]
            await node.remove_engine(engine_url)
            assert (await node.status())["engines"] == []
    finally:
        stop_server(proc)


def test_serving_beyond_loopback_needs_a_key(tmp_path):
    argv = cli(
        "serve-rollout", "--config", CONFIG, "--host", "0.0.0.0", "--state-dir", str(tmp_path)
    )
    done = subprocess.run(
        [*argv, *NODE_OVERRIDES],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=_env(),
        timeout=BOUND_S,
    )
    assert done.returncode == 2 and "API key" in done.stderr


async def test_the_node_serves_openai_chat_completions_on_its_engines(node_url):
    body = {"messages": [{"role": "user", "content": "Compute 1+1."}], "max_tokens": 4}
    async with aiohttp.ClientSession() as s:
        async with s.post(
            f"{node_url}/v1/chat/completions", json=body, headers={"X-Episode-Id": "chat-1"}
        ) as resp:
            assert resp.status == 200, await resp.text()
            reply = await resp.json()
            holder = {"X-Episode-Token": resp.headers["X-Episode-Token"]}  # the server's
        assert reply["object"] == "chat.completion" and reply["usage"]["completion_tokens"] >= 1
        async with s.get(f"{node_url}/v1/episodes/chat-1", headers=holder) as resp:
            assert resp.status == 200


async def test_answers_past_the_memory_bound_are_read_back_from_the_log(tmp_path):
    from tunix_agentic.config import load_config
    from tunix_agentic.rollout.service.engines import EngineSet
    from tunix_agentic.rollout.service.node import RolloutNode, setup_from_config

    setup = setup_from_config(load_config(CONFIG, NODE_OVERRIDES))
    # No engine: every episode ends on an infrastructure fault, quickly; the group is done
    # with its members dropped.
    node = RolloutNode(setup, EngineSet([]), tmp_path, keep_answers=1)
    await node.start()
    try:
        answers = []
        for gid in ("mem-1", "mem-2"):
            await node.submit(ref_request(gid))
            st = node.groups[gid]
            await asyncio.wait_for(st.finished.wait(), BOUND_S)
            answers.append(await node.answer(st))
        assert node.groups["mem-1"].answer is None  # evicted: only one answer is held
        twice = await asyncio.gather(*(node.submit(ref_request("mem-3")) for _ in range(2)))
        assert [answer["group_id"] for answer in twice] == ["mem-3", "mem-3"]  # both accepted
        accepted = [json.loads(line) for line in (tmp_path / "groups.wal").read_text().splitlines()]
        assert sum(r["kind"] == "accepted" and r["group_id"] == "mem-3" for r in accepted) == 1
        assert await node.answer(node.groups["mem-1"]) == answers[0]
        assert answers[0]["group"]["lost"] == 2 and answers[0]["group"]["dropped"]
    finally:
        await node.close()


def test_the_node_modules_and_its_command_load_no_device_library():
    probe = (
        "import sys\n"
        "import tunix_agentic.rollout.service.node_http, tunix_agentic.rollout.client.runner\n"
        "from tunix_agentic.cli.main import main\n"
        "try:\n"
        "    main(['serve-rollout', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'jax', 'flax', 'optax', 'orbax', 'grain'}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=BOUND_S
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


# ------------------------------------------------------------ throughput (issue 21)
@pytest.mark.parametrize(
    "pools, expected",
    [((32, 4, 32, 2), 34), ((64, 64, 64, 8), 24), ((1, 1, 1, 8), 1)],
    ids=["test-node", "default-recipe", "fewer-than-a-group"],
)
def test_by_default_a_node_runs_enough_groups_to_fill_every_stage_pool(pools, expected):
    from tunix_agentic.config import load_config
    from tunix_agentic.rollout.service.node import setup_from_config

    init, run, evaluate, size = pools
    overrides = [
        f"rollout.init_workers={init}",
        f"rollout.run_workers={run}",
        f"rollout.eval_workers={evaluate}",
        f"rollout.group_size={size}",
    ]
    assert setup_from_config(load_config(CONFIG, [*NODE_OVERRIDES, *overrides])).max_groups == (
        expected
    )


def test_serve_rollout_refuses_max_groups_below_one(capsys):
    from tunix_agentic.config import load_config
    from tunix_agentic.rollout.service.node_http import serve_rollout_main

    assert serve_rollout_main(load_config(CONFIG, NODE_OVERRIDES), max_groups=0) == 2
    assert "--max-groups must be >= 1" in capsys.readouterr().err


async def test_an_answer_without_members_is_the_logged_group_alone(node_url):
    async with NodeClient(node_url) as node:
        await node.submit(ref_request("lean-1"))
        lean = await node.get("lean-1", wait_s=BOUND_S, members=False)
        full = await node.get("lean-1")
        assert lean["status"] == full["status"] == "done"
        assert "members" not in lean and lean["group"] == full["group"]
        assert [m["episode_id"] for m in full["members"]] == [
            t["episode_id"] for t in full["group"]["trajectories"]
        ]
        assert await node.wait("lean-1", BOUND_S) == group_from_json(full["group"])
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{node_url}/v1/groups/lean-1?members=maybe") as resp:
                assert resp.status == 400
                assert "members must be true or false" in (await resp.json())["error"]["message"]


async def test_the_logged_answer_is_the_answer_served(tmp_path):
    from tunix_agentic.config import load_config
    from tunix_agentic.rollout.service.engines import EngineSet
    from tunix_agentic.rollout.service.node import RolloutNode, setup_from_config

    setup = setup_from_config(load_config(CONFIG, NODE_OVERRIDES))
    node = RolloutNode(setup, EngineSet([]), tmp_path)  # no engine: members dropped, quickly
    await node.start()
    try:
        await node.submit(ref_request("log-1"))
        st = node.groups["log-1"]
        await asyncio.wait_for(st.finished.wait(), BOUND_S)
        served = await node.answer(st, members=False)
    finally:
        await node.close()
    lines = [json.loads(line) for line in (tmp_path / "groups.wal").read_text().splitlines()]
    final = next(r for r in lines if r["kind"] == "final" and r["group_id"] == "log-1")
    assert final["answer"] == {"error": served["error"], "group": served["group"]}
    assert served["group"]["lost"] == 2 and served["cursor"] == final["cursor"] == 1


async def test_a_prompt_past_the_engines_window_is_too_long_as_in_process(engine_url):
    from tunix_agentic.inference.base import PromptTooLongError
    from tunix_agentic.rollout.service.engines import EngineSet

    engines = EngineSet([engine_url])
    try:
        with pytest.raises(PromptTooLongError, match="max_seq_len"):
            await engines.generate([5] * 200)  # the module's engine: max_seq_len 128
    finally:
        await engines.close()


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("token_ids", [5, True], r"trajectory\.token_ids\[1\] must be an integer"),
        ("token_ids", [5, 6.0], r"trajectory\.token_ids\[1\] must be an integer"),
        ("timings", {"episode_s": "1"}, r"trajectory\.timings\.episode_s must be a number"),
        # A node's answer with impossible logprobs is refused (issue 32, item 1).
        ("logprobs", [-1.0, float("nan")], r"steps\[0\]\.logprobs\[1\] must be a finite logprob"),
        ("logprobs", [0.5, -1.0], r"steps\[0\]\.logprobs\[0\] must be a finite logprob"),
    ],
    ids=["bool-id", "float-id", "string-time", "nan-logprob", "positive-logprob"],
)
def test_a_trajectory_with_a_bad_element_names_it(field, value, message):
    obj = trajectory_to_json(_trajectory())
    if field == "logprobs":
        obj["steps"][0]["logprobs"] = value
    else:
        obj[field] = value
    with pytest.raises(ValueError, match=message):
        trajectory_from_json(obj)


def test_integer_logprobs_come_back_as_floats():
    obj = trajectory_to_json(_trajectory())
    obj["steps"][0]["logprobs"] = [0, -1]
    logprobs = trajectory_from_json(obj).steps[0].logprobs
    assert logprobs == [0.0, -1.0] and all(type(x) is float for x in logprobs)
