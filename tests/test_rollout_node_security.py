"""A rollout node many clients share, tried as an attacker would (issue 32, items 1-4, 7).

Each test runs a real node (``start_node_server``) on 127.0.0.1 and attacks it over HTTP:
operator routes without the admin key, an engine that lies, other clients' episodes,
oversized and over-many groups, deeply nested JSON. The lying engine is a server written
here on purpose: it is the attacker (it follows SGLang's ``/generate`` wire format).
"""

from __future__ import annotations

import asyncio
import json
import math
import stat
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tunix_agentic.config import load_config
from tunix_agentic.envs.base import Task
from tunix_agentic.rollout.client.node_client import NodeClient
from tunix_agentic.rollout.service.admin import RUNTIME_DIR_ENV, local_token, token_path
from tunix_agentic.rollout.service.caps import NodeCaps
from tunix_agentic.rollout.service.engines import EngineSet
from tunix_agentic.rollout.service.node import RolloutNode, setup_from_config
from tunix_agentic.rollout.service.node_http import start_node_server
from tunix_agentic.rollout.wire import GroupRequest
from tunix_agentic.serving.http import serve_app
from tunix_agentic.serving.timeouts import ServerTimeouts
from tunix_agentic.testing import TINY_RUN_OVERRIDES

REPO = Path(__file__).resolve().parents[1]
CONFIG = str(REPO / "configs" / "calculator_tiny.yaml")
OVERRIDES = [
    *TINY_RUN_OVERRIDES,
    "engine.max_seq_len=128",
    "rollout.infra_backoff_s=0",
    "rollout.infra_backoff_max_s=0",
    "rollout.backend_wait_s=0",  # an engine that failed is not waited for
]
BOUND_S = 120  # a bound against hangs, never a timing assertion
DEEP = "[" * 100_000 + "]" * 100_000


@pytest.fixture(scope="module")
def setup():
    return setup_from_config(load_config(CONFIG, OVERRIDES))


@pytest.fixture
async def serve_node(setup, tmp_path, monkeypatch):
    """``serve_node(engine_urls=(), caps=None, max_groups=None, **server) -> (node, url)``."""
    monkeypatch.setenv(RUNTIME_DIR_ENV, str(tmp_path / "run"))
    started = []

    async def start(engine_urls=(), caps=None, max_groups=None, **server):
        state = tmp_path / f"node{len(started)}"
        node = RolloutNode(
            setup, EngineSet(list(engine_urls)), state, caps=caps, max_groups=max_groups
        )
        runner, port = await start_node_server(node, **server)
        started.append((runner, node))
        return node, f"http://127.0.0.1:{port}"

    yield start
    for runner, node in started:
        await runner.cleanup()
        await node.close()


async def _call(method, url, body=None, headers=None, data=None):
    async with aiohttp.ClientSession() as http:
        async with http.request(method, url, json=body, data=data, headers=headers) as resp:
            answer = await resp.json(content_type=None) if resp.status != 204 else None
            return resp.status, answer, resp.headers


def _operator(url: str) -> dict:
    """The node's own trainer's headers: the admin token the node left on this machine."""
    return {"Authorization": f"Bearer {local_token(url)}"}


def _external(group_id: str, prompt: str = "Compute 1+1.") -> dict:
    task = Task(task_id=group_id, prompt=prompt)
    return GroupRequest(group_id, 1, task=task, agent="external").to_json()


# ------------------------------------------------------------------ item 1: scopes
OPERATOR_ROUTES = [
    ("POST", "/v1/engines", {"url": "http://127.0.0.1:9"}),
    ("DELETE", "/v1/engines", {"url": "http://127.0.0.1:9"}),
    ("POST", "/v1/policy", {"version": 999}),
    ("DELETE", "/v1/groups/someone-elses", None),
]


@pytest.mark.parametrize(
    "api_key, admin_key", [(None, None), ("agents", "operator")], ids=["loopback", "keys"]
)
async def test_operator_routes_are_closed_to_all_but_the_admin_key(serve_node, api_key, admin_key):
    """With no key, or with an agents' API key, nobody but the admin key's holder adds an
    engine, sets the policy or cancels a group; the node's own trainer (a NodeClient on
    this machine, no configuration) finds the node's generated token and may."""
    node, url = await serve_node(api_key=api_key, admin_key=admin_key)
    port = int(url.rsplit(":", 1)[1])
    written = token_path(port)
    if admin_key is None:  # generated, left for this user only
        assert stat.S_IMODE(written.stat().st_mode) == 0o600
    else:
        assert not written.exists()
    agent = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    for method, path, body in OPERATOR_ROUTES:
        status, answer, _ = await _call(method, url + path, body, agent)
        assert status == 403 and "admin key" in answer["error"]["message"], (path, answer)
    assert node.engines.urls == [] and node.engines.policy_version == 0
    async with NodeClient(url, api_key=api_key, admin_key=admin_key) as trainer:
        assert (await trainer.add_engine("http://127.0.0.1:9"))["engines"] == ["http://127.0.0.1:9"]
        assert await trainer.set_policy(3) == 3
        await trainer.submit(GroupRequest.from_json(_external("mine")))
        assert await trainer.cancel("mine") == "cancelled"


# ------------------------------------------------------------- item 1: engine replies
def _reply(ids, logprobs, versions):
    lps = [[lp, t, None] for lp, t in zip(logprobs, ids, strict=True)]
    meta = {
        "output_token_logprobs": lps,
        "output_token_versions": versions,
        "finish_reason": {"type": "length"},
        "prompt_tokens": 3,
    }
    return {"output_ids": ids, "meta_info": meta}


@pytest.fixture
async def lying_engine():
    """``lying_engine(reply) -> url``: a server answering every ``/generate`` with ``reply``."""
    runners = []

    async def start(reply):
        async def generate(_request):
            return web.json_response(reply)  # NaN goes out as NaN, as Python's JSON writes it

        async def health(_request):
            return web.json_response({"ok": True})

        app = web.Application()
        app.router.add_post("/generate", generate)
        app.router.add_post("/abort_request", health)
        app.router.add_get("/health", health)
        runner, port = await serve_app(
            app, "127.0.0.1", 0, timeouts=ServerTimeouts(), shutdown_timeout_s=1.0
        )
        runners.append(runner)
        return f"http://127.0.0.1:{port}"

    yield start
    for runner in runners:
        await runner.cleanup()


def _replies(vocab: int):
    ok = ([1, 2], [-0.5, -1.0], [0, 0])
    return {
        "valid": (ok, None),
        "tiny-positive-noise": (([1, 2], [5e-5, -1.0], [0, 0]), None),
        "nan-logprob": (([1, 2], [math.nan, -1.0], [0, 0]), "output_token_logprobs[0] is nan"),
        "positive-logprob": (([1, 2], [-1.0, 0.7], [0, 0]), "output_token_logprobs[1] is 0.7"),
        "id-past-vocabulary": (([1, vocab], [-1.0, -1.0], [0, 0]), "output_ids[1]"),
        "version-ahead": (([1, 2], [-1.0, -1.0], [0, 999]), "output_token_versions[1] is 999"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "valid",
        "tiny-positive-noise",
        "nan-logprob",
        "positive-logprob",
        "id-past-vocabulary",
        "version-ahead",
    ],
    ids=str,
)
async def test_an_engine_reply_that_cannot_be_true_is_never_recorded(
    setup, serve_node, lying_engine, case
):
    (ids, logprobs, versions), why = _replies(setup.vocab_size)[case]
    engine = await lying_engine(_reply(ids, logprobs, versions))
    node, url = await serve_node([engine])
    node.engines.publish(0, None)  # a trainer's node: replies are held to its version
    body = {"messages": [{"role": "user", "content": "Compute 1+1."}], "max_tokens": 2}
    status, answer, _ = await _call(
        "POST", f"{url}/v1/chat/completions", body, {"X-Episode-Id": "e"}
    )
    store = node.openai.store
    if why is None:
        assert status == 200 and len(store.open) == 1
        return
    # The backend's infrastructure error, named (the engine and the field); nothing kept.
    message = answer["error"]["message"]
    assert status == 503 and engine in message and why in message, message
    assert not store.open and not store.closed


# ------------------------------------------------------ item 2: claims and their tokens
async def test_a_claimed_member_is_its_claimant_s_alone(serve_node):
    node, url = await serve_node()
    assert (await _call("POST", f"{url}/v1/groups", _external("ext"), _operator(url)))[0] == 202
    status, claim, _ = await _call("POST", f"{url}/v1/episodes/claim", {"wait_s": BOUND_S})
    assert status == 200 and claim["group_id"] == "ext"
    eid, token = claim["episode_id"], claim["episode_token"]
    assert len(eid) >= 24 and "ext" not in eid and len(token) >= 32  # nothing to guess from
    path = f"{url}/v1/episodes/{eid}"
    for headers, expected in (({}, 401), ({"X-Episode-Token": "a-guess-at-the-token"}, 404)):
        assert (await _call("GET", path, None, headers))[0] == expected
        assert (await _call("POST", f"{path}/reward", {"reward": 1}, headers))[0] == expected
    # Nobody but the operator cancels the group under its agent.
    assert (await _call("DELETE", f"{url}/v1/groups/ext"))[0] == 403
    assert node.groups["ext"].status == "running"
    assert node.external.counts() == {"offered": 0, "claimed": 1, "expired": 0}
    # The claimant's own call (no engine here: a 503) opens nothing; its token is accepted.
    body = {"messages": [{"role": "user", "content": claim["prompt"]}]}
    mine = {"X-Episode-Id": eid, "X-Episode-Token": token}
    assert (await _call("POST", f"{url}/v1/chat/completions", body, mine))[0] == 503
    status, answer, _ = await _call("POST", f"{path}/reward", {"reward": 1}, mine)
    assert status == 409 and "no recorded call" in answer["error"]["message"]


# ------------------------------------------------------------------- item 4: caps
async def test_caps_answer_413_or_429_naming_the_cap(serve_node):
    node, url = await serve_node(caps=NodeCaps(max_queued=1, max_task_bytes=4096), max_groups=1)
    groups, op = f"{url}/v1/groups", _operator(url)
    status, answer, _ = await _call("POST", groups, _external("big", "x" * 5000), op)
    assert status == 413 and "--max-task-kb" in answer["error"]["message"]
    assert (await _call("POST", groups, _external("runs"), op))[0] == 202
    assert (await _call("POST", groups, _external("waits"), op))[0] == 202
    status, answer, _ = await _call("POST", groups, _external("one-too-many"), op)
    assert status == 429 and "--max-queued" in answer["error"]["message"]
    assert [node.groups[g].status for g in ("runs", "waits")] == ["running", "queued"]
    assert "big" not in node.groups and "one-too-many" not in node.groups
    node.caps = NodeCaps(max_log_bytes=1)  # the log now holds more than a byte
    status, answer, _ = await _call("POST", groups, _external("past-the-log"), op)
    assert status == 429 and "--max-log-mb" in answer["error"]["message"]
    # The same id and body again is not a new group: answered as before, under any cap.
    assert (await _call("POST", groups, _external("waits"), op))[0] == 202


# ------------------------------------------------------------- item 7: deep JSON
@pytest.mark.parametrize("where", ["group", "task", "claim"], ids=str)
async def test_deeply_nested_json_is_a_400_naming_the_limit(serve_node, where):
    _, url = await serve_node()
    if where == "claim":
        path, data = "/v1/episodes/claim", DEEP
    elif where == "group":
        path, data = "/v1/groups", DEEP
    else:  # within what the parser takes, past the node's limit: a task's data 100 deep
        nested: list = []
        for _ in range(100):
            nested = [nested]
        body = _external("deep")
        body["task"]["fields"]["data"] = {"x": nested}
        path, data = "/v1/groups", json.dumps(body)
    status, answer, _ = await _call("POST", url + path, data=data)
    assert status == 400 and "the limit is 64 levels" in answer["error"]["message"], answer


# ------------------------------------------- round 3, items 5 and 6: groups are their owner's
async def test_a_client_can_neither_read_nor_take_the_trainer_s_groups(serve_node):
    """The trainer (a NodeClient on this machine: the node's admin token) submits an
    external group; another client on the same node sees none of it, cannot take its id,
    cannot submit external or own_tasks groups, and reads only its own."""
    node, url = await serve_node()
    trainer_id = "run1-g0-v0-t0-9f2c4a"
    async with NodeClient(url) as trainer:
        assert await trainer.submit(GroupRequest.from_json(_external(trainer_id))) == "running"
        assert await trainer.cancel(trainer_id) == "cancelled"  # final: listed from now on
        assert [g["group_id"] for g in (await trainer.done_since(0))["groups"]] == [trainer_id]
    groups = f"{url}/v1/groups"
    # The other client lists nothing and cannot read it.
    status, listed, _ = await _call("GET", f"{groups}?done_since=0")
    assert status == 200 and listed["groups"] == [], listed
    assert (await _call("GET", f"{groups}/{trainer_id}"))[0] == 404
    # Its id, with the trainer's body or another, is not the client's to take.
    for prompt in ("Compute 1+1.", "Compute 2+2."):
        body = _external(trainer_id, prompt)
        body["agent"] = "builtin"
        status, answer, _ = await _call("POST", groups, body)
        assert status == 409 and "taken" in answer["error"]["message"], answer
    assert node.groups[trainer_id].status == "cancelled"
    # Groups whose members any agent fills are the operator's to submit.
    for agent in ("external", "own_tasks"):
        body = _external(f"mine-{agent}")
        body["agent"] = agent
        status, answer, _ = await _call("POST", groups, body)
        assert status == 403 and "admin key" in answer["error"]["message"], answer
        assert f"mine-{agent}" not in node.groups
    # A group of its own it reads, and so does the operator.
    body = _external("mine")
    body["agent"] = "builtin"
    assert (await _call("POST", groups, body))[0] == 202
    assert (await _call("GET", f"{groups}/mine"))[0] == 200
    assert node.groups["mine"].owner == "addr:127.0.0.1"
    async with NodeClient(url) as trainer:
        assert (await trainer.get("mine"))["group_id"] == "mine"


async def test_group_owners_survive_a_node_restart(setup, tmp_path, monkeypatch):
    """The owner is logged with the group: after a restart the other client still reads
    none of the trainer's groups."""
    monkeypatch.setenv(RUNTIME_DIR_ENV, str(tmp_path / "run"))
    state = tmp_path / "state"
    for attempt in range(2):
        node = RolloutNode(setup, EngineSet([]), state)
        runner, port = await start_node_server(node)
        url = f"http://127.0.0.1:{port}"
        try:
            if attempt == 0:
                assert (await _call("POST", f"{url}/v1/groups", _external("t"), _operator(url)))[
                    0
                ] == 202
            else:  # the node restarted: the group was lost, still the operator's
                assert node.groups["t"].status == "lost" and node.groups["t"].owner == "operator"
                assert (await _call("GET", f"{url}/v1/groups/t"))[0] == 404
                assert (await _call("GET", f"{url}/v1/groups/t", None, _operator(url)))[0] == 200
        finally:
            await runner.cleanup()
            await node.close()


# ------------------------------------------------- round 3, item 12: claims per client
async def test_one_client_cannot_claim_every_member_and_sit_on_them(serve_node):
    """A client holds at most --max-claims members; a claim with no call is withdrawn after
    the first-call lease (not the whole lease) and offered again under a fresh id."""
    node, url = await serve_node(caps=NodeCaps(max_claims_per_client=2), external_first_call_s=0.3)
    body = GroupRequest(
        "three", 3, task=Task(task_id="three", prompt="Compute 1+1."), agent="external"
    ).to_json()
    assert (await _call("POST", f"{url}/v1/groups", body, _operator(url)))[0] == 202
    claim = f"{url}/v1/episodes/claim"
    first = [(await _call("POST", claim, {"wait_s": BOUND_S}))[1]["episode_id"] for _ in range(2)]
    status, answer, _ = await _call("POST", claim, {"wait_s": 0})
    assert status == 429 and "--max-claims" in answer["error"]["message"], answer
    assert node.external.counts()["offered"] == 1  # the third member is still there for others
    # Neither claim made a call: both are withdrawn after 0.3 s (not the 300 s lease) and
    # offered again, so the client may claim again, a fresh member.
    async with asyncio.timeout(BOUND_S):
        while node.external.counts()["expired"] < 2:
            await asyncio.sleep(0.05)
    status, again, _ = await _call("POST", claim, {"wait_s": BOUND_S})
    assert status == 200 and again["episode_id"] not in first
    assert node.groups["three"].status == "running"
