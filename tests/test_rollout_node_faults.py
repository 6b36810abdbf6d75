"""A rollout node under the faults an operator meets: a second node on its state dir, a
damaged log, a group cancelled while it waits, an engine killed and restarted.

Nodes run in this process (no engine unless the test needs one) or as real
``serve-rollout`` processes; the engine is a real tiny ``serve-engine`` process.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import pytest

from tunix_agentic.envs.base import Environment, StepResult, Task, register_env
from tunix_agentic.rollout.service.wal import (
    FinalRecord,
    GroupLog,
    LogDamaged,
    StateDirBusy,
    repair_log,
)
from tunix_agentic.rollout.wire import GroupRequest, SamplingSpec
from tunix_agentic.testing import TINY_RUN_OVERRIDES, cli, spawn_server, stop_server

REPO = Path(__file__).resolve().parents[1]
CONFIG = str(REPO / "configs" / "calculator_tiny.yaml")
NODE_OVERRIDES = [*TINY_RUN_OVERRIDES, "rollout.infra_backoff_s=0", "rollout.infra_backoff_max_s=0"]
BOUND_S = 120  # a bound against hangs, never a timing assertion


@register_env("faults_hang_init")
class HangInitEnv(Environment):
    """Its reset never returns: a group of it holds its node slot until cancelled."""

    async def reset(self, task) -> str:
        await asyncio.sleep(3600)
        return ""

    async def step(self, action) -> StepResult:
        return StepResult("", 0.0, True)


def _node(state_dir: Path, **kwargs):
    from tunix_agentic.config import load_config
    from tunix_agentic.rollout.service.engines import EngineSet
    from tunix_agentic.rollout.service.node import RolloutNode, setup_from_config

    setup = setup_from_config(load_config(CONFIG, NODE_OVERRIDES))
    return RolloutNode(setup, EngineSet([]), state_dir, **kwargs)


def _hanging(group_id: str) -> GroupRequest:
    return GroupRequest(
        group_id=group_id,
        num_samples=1,
        task=Task(task_id=group_id, prompt="wait"),
        env="faults_hang_init",
        sampling=SamplingSpec(max_tokens=4),
        max_turns=1,
    )


def _run_node_cli(state_dir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TUNIX_AGENTIC_API_KEY"}
    argv = cli("serve-rollout", "--config", CONFIG, "--port", "0", "--state-dir", str(state_dir))
    return subprocess.run(
        [*argv, *args, *NODE_OVERRIDES],
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        cwd=REPO,
        env={**env, "JAX_PLATFORMS": "cpu"},
    )


async def _write_log(state_dir: Path) -> bytes:
    """A log holding group "a" accepted and fsynced done, then group "b" accepted."""
    log = GroupLog(state_dir)
    log.open()
    await log.accepted("a", {"x": 1})
    await log.finished(FinalRecord("a", "done", 1, {"error": None}))
    await log.accepted("b", {"x": 2})
    log.close()
    return log.path.read_bytes()


# ---------------------------------------------------------------- state dir lock
def test_a_second_log_on_a_state_dir_is_refused_until_the_first_closes(tmp_path):
    first = GroupLog(tmp_path)
    first.open()
    with pytest.raises(StateDirBusy, match=rf"{tmp_path}.*pid {os.getpid()}"):
        GroupLog(tmp_path).open()  # another open file description: flock refuses it
    first.close()
    second = GroupLog(tmp_path)
    second.open()  # released with the first
    second.close()


async def test_a_second_node_process_on_a_live_nodes_state_dir_fails_at_start(tmp_path):
    node = _node(tmp_path)
    await node.start()
    try:
        await node.submit(_hanging("live"))
        done = await asyncio.to_thread(_run_node_cli, tmp_path)
        assert done.returncode == 2, done.stderr[-2000:]
        assert f"--state-dir {tmp_path} is in use" in done.stderr
        assert f"pid {os.getpid()}" in done.stderr
        assert node.groups["live"].status == "running"  # the second node wrote nothing
        lines = (tmp_path / "groups.wal").read_text().splitlines()
        assert [json.loads(line)["kind"] for line in lines] == ["accepted"]
    finally:
        await node.close()


# ------------------------------------------------------------------ damaged log
async def test_a_damaged_last_line_ending_in_a_newline_names_the_line_and_the_repair(tmp_path):
    whole = await _write_log(tmp_path)
    lines = whole.split(b"\n")
    # The done record of "a" (line 2) damaged in place, its newline kept; "b" stays after it.
    damaged = b"\n".join([lines[0], lines[1][:-5] + b"#####", *lines[2:]])
    (tmp_path / "groups.wal").write_bytes(damaged)
    with pytest.raises(LogDamaged, match=r"groups\.wal: line 2 .*--repair-log") as err:
        GroupLog(tmp_path).open()
    assert err.value.line == 2
    assert (tmp_path / "groups.wal").read_bytes() == damaged  # nothing cut
    # The damaged line last, as a disk fault would leave it: an error too, not "torn".
    (tmp_path / "groups.wal").write_bytes(b"\n".join([lines[0], lines[1][:-5] + b"#####", b""]))
    with pytest.raises(LogDamaged, match="line 2"):
        GroupLog(tmp_path).open()

    fixed = repair_log(tmp_path)
    assert [n for n, _ in fixed.dropped] == [2] and fixed.torn_bytes == 0
    log = GroupLog(tmp_path)
    replay = log.open()
    log.close()
    assert replay.finals == [] and replay.unfinished == ["a"]  # lost, said so by the repair


async def test_a_torn_last_line_without_a_newline_is_still_cut_quietly(tmp_path):
    whole = await _write_log(tmp_path)
    with open(tmp_path / "groups.wal", "ab") as f:
        f.write(b'{"kind":"final","group_id":"b"')
    log = GroupLog(tmp_path)
    replay = log.open()
    log.close()
    assert [r.group_id for r in replay.finals] == ["a"] and replay.unfinished == ["b"]
    assert replay.torn_bytes > 0 and (tmp_path / "groups.wal").read_bytes() == whole


async def test_a_final_record_for_a_group_never_accepted_names_its_line(tmp_path):
    await _write_log(tmp_path)
    with open(tmp_path / "groups.wal", "ab") as f:
        f.write(b'{"kind":"final","group_id":"ghost","status":"done","cursor":2,"answer":{}}\n')
        f.write(b'{"kind":"accepted","group_id":"c","body":{}}\n')
    with pytest.raises(LogDamaged, match=r"line 4 .*'ghost', which no line before accepted"):
        GroupLog(tmp_path).open()
    fixed = repair_log(tmp_path)
    assert [n for n, _ in fixed.dropped] == [4] and "ghost" in fixed.dropped[0][1]
    log = GroupLog(tmp_path)
    replay = log.open()
    log.close()
    assert [r.group_id for r in replay.finals] == ["a"] and replay.unfinished == ["b", "c"]


def test_serve_rollout_stops_on_a_damaged_log_and_repair_log_drops_the_line(tmp_path):
    asyncio.run(_write_log(tmp_path))
    with open(tmp_path / "groups.wal", "ab") as f:
        f.write(b"not json\n")
    done = _run_node_cli(tmp_path)
    assert done.returncode == 2 and "groups.wal: line 4" in done.stderr, done.stderr[-2000:]
    argv = cli("serve-rollout", "--config", CONFIG, "--port", "0", "--state-dir", str(tmp_path))
    log = tmp_path / "node.err"
    proc, _ = spawn_server(
        [*argv, "--repair-log", *NODE_OVERRIDES],
        "serving rollout node on ",
        log=log,
        timeout_s=BOUND_S,
    )
    stop_server(proc)
    assert "repair-log: dropped line 4: not json" in log.read_text()
    kinds = [json.loads(x)["kind"] for x in (tmp_path / "groups.wal").read_text().splitlines()]
    assert kinds == ["accepted", "final", "accepted", "final"]  # "b" now final: lost


# ----------------------------------------------------------------- cancel race
async def test_a_group_cancelled_while_queued_never_starts_even_if_a_slot_frees_meanwhile(
    tmp_path,
):
    node = _node(tmp_path, max_groups=1)
    await node.start()
    real_finished = node.log.finished
    freed = []

    async def finished(rec: FinalRecord, text: str | None = None) -> int:
        # Between the cancel's "finishing" and its record reaching the disk, the running
        # group's slot frees (the moment the scheduler looks at the queue again).
        if rec.group_id == "queued" and rec.status == "cancelled":
            job = node.groups["holder"].job
            job.cancel()
            await asyncio.wait({job})
            await asyncio.sleep(0)  # the job's done-callback (the scheduler) has run
            freed.append(node.groups["queued"].job)
        return await real_finished(rec, text)

    node.log.finished = finished
    try:
        await node.submit(_hanging("holder"))
        await node.submit(_hanging("queued"))
        assert [node.groups[g].status for g in ("holder", "queued")] == ["running", "queued"]
        assert (await node.cancel("queued"))["status"] == "cancelled"
        assert freed == [None]  # the slot freed while the cancel was being written...
        assert node.groups["queued"].job is None  # ...and the group was not started
        await asyncio.sleep(0)
        finals = [
            json.loads(line)
            for line in (tmp_path / "groups.wal").read_text().splitlines()
            if '"final"' in line
        ]
        assert [(r["group_id"], r["status"]) for r in finals] == [("queued", "cancelled")]
    finally:
        await node.close()


# ------------------------------------------------------------- engine restart
ENGINE_OVERRIDES = ["engine.max_seq_len=128", "engine.decode_steps=2"]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn_engine(port: int, weights_dir: Path, log: Path):
    from tunix_agentic.testing import TINY_MODEL_OVERRIDES

    argv = cli(
        "serve-engine",
        "--config",
        CONFIG,
        "--port",
        str(port),
        "--weights-dir",
        str(weights_dir),
        *TINY_MODEL_OVERRIDES,
        *ENGINE_OVERRIDES,
    )
    return spawn_server(argv, "serving on ", log=log, timeout_s=BOUND_S)


@pytest.mark.slow  # two engine server starts (~20 s each on 2 quiet cores)
async def test_the_only_engine_killed_and_restarted_costs_no_episode_and_no_stale_weights(
    tmp_path,
):
    """The node's only engine is SIGKILLed mid-group and started again on its port with
    other weights (version 0): the group waits for it (rollout.backend_wait_s), the node
    pushes the published weights (v5) before using it again, and no member is dropped
    or sampled by the restarted engine's own weights."""
    from flax import nnx

    from tunix_agentic.checkpoint import save_params
    from tunix_agentic.config import load_config
    from tunix_agentic.models.hf import build_model
    from tunix_agentic.rollout.service.engines import EngineSet
    from tunix_agentic.rollout.service.node import RolloutNode, setup_from_config
    from tunix_agentic.rollout.wire import SeedSpec, TaskRef
    from tunix_agentic.serving.client import SGLangEngine

    weights, port = tmp_path / "weights", _free_port()
    weights.mkdir()
    published = weights / "v5-trainer"
    cfg = load_config(CONFIG, NODE_OVERRIDES)
    save_params(published, nnx.state(build_model(cfg.model, seed=5), nnx.Param))
    proc, url = _spawn_engine(port, weights, tmp_path / "engine.log")
    trainer = SGLangEngine(url)  # the trainer's side: publishes v5 to the engine
    setup = setup_from_config(load_config(CONFIG, [*NODE_OVERRIDES, "rollout.backend_wait_s=60"]))
    node = RolloutNode(setup, EngineSet([url]), tmp_path / "state")
    await node.start()

    def request(gid: str, index: int) -> GroupRequest:
        return GroupRequest(
            group_id=gid,
            num_samples=2,
            task_ref=TaskRef("arithmetic", "train", index),
            sampling=SamplingSpec(max_tokens=8),
            max_turns=2,
            seed=SeedSpec(run_seed=7, index=index),
            policy_version=5,
        )

    async def finished(gid: str) -> dict:
        await asyncio.wait_for(node.groups[gid].finished.wait(), BOUND_S)
        return await node.answer(node.groups[gid])

    try:
        await trainer.update_weights_from_disk(published, 5)
        node.engines.publish(5, str(published))
        await node.submit(request("before", 1))
        before = await finished("before")
        assert before["status"] == "done" and not before["group"]["dropped"]
        proc.kill()  # SIGKILL
        proc.wait()
        await node.submit(request("across", 2))
        proc, _ = await asyncio.to_thread(
            _spawn_engine, port, weights, tmp_path / "engine.log"
        )  # same port, started with its own weights (version 0)
        across = await finished("across")
        assert across["status"] == "done", across
        assert not across["group"]["dropped"] and across["group"]["lost"] == 0, across["group"]
        versions = {v for m in across["members"] for v in m["versions"]}
        assert versions == {5}  # every token sampled by the published weights
        assert (await trainer.model_info())["weight_version"] == "5"  # pushed by the node
        assert node.stats["infra_failures"] == 0
    finally:
        await node.close()
        await trainer.close()
        stop_server(proc)
