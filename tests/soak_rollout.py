"""Rollout as a service under faults: checks and figures, printed; exit 1 when a check fails.

Real processes on loopback: two ``tunix-agentic serve-engine`` servers and two
``tunix-agentic serve-rollout`` nodes; the trainer's side is this process, driving
groups through the real :class:`~tunix_agentic.rollout.client.runner.ServiceEpisodeRunner`
(what ``tunix-agentic train rollout.service.urls=...`` runs groups with; the learner
is left out, so the policy stays at version 0 and the engines are never re-weighted).

The environment is ``soak_probe`` (tests/soak_env.py, imported by the nodes
through ``env.import``): a real bubblewrap sandbox per episode, one tool call per
turn, of which ``--crash-rate`` crash and ``--hang-rate`` hang until the tool timeout
(``env.tool_timeout_s``) cuts them; ``--reset-fail-rate`` of the sandbox starts fail
(infrastructure failures, retried by the node: the kills alone may cause none, as
the node's engine pool and the client absorb them). The engines serve the tiny
calculator model, first taught here in a few seconds to answer every turn with a
short reply (a random model rarely ends a turn, and a turn that does not end calls
no tool).

While ``--episodes`` episodes run (``--concurrency`` groups in flight), one engine
server is SIGKILLed and restarted on its port, then one rollout node is SIGKILLed
and restarted on its port and state dir. Checks:

* every submitted group ended with exactly one outcome at the client, ``done`` (none
  lost, none twice);
* the nodes' logs: each group finished on one node, except one the killed node had
  finished (on disk) when the kill cut off its answer: resubmitted, it ran again
  (counted in ``done_twice_answer_cut_by_kill``);
* infrastructure failures never entered group statistics: a group's scored
  trajectories hold no infrastructure status, what failed on infrastructure is in
  ``dropped`` only, and scored + lost = the group's size;
* no sandbox process (one whose argv holds the run's marker) or sandbox directory left,
  while the nodes are idle at the end and after they stopped;
* each node's RSS (``/proc/PID/status`` VmRSS) at the last episode is within 10 % of
  its RSS at episode ``--rss-from`` (after both restarts). The baseline is taken once
  both restarted servers are up: if they came up so late that more than half the episodes
  from ``--rss-from`` to the end had passed, the check fails and says the memory was not
  checked (``rss_baseline_on_time``), instead of comparing two neighbouring episodes
  (``--no-memory-check`` leaves both RSS checks out of a soak too short to measure memory,
  and the result says memory was not checked);
* the restarted engine is healthy again on every node, and the client took the
  restarted node back.

The last line is one JSON object with the counts (groups, episodes, tool calls, tool
crashes, hangs cut, resubmissions, infrastructure failures...) and the checks.

    python tests/soak_rollout.py                      # 500 episodes
    python tests/soak_rollout.py --episodes 48 --rss-from 24 --node-kill-at 0.25

A fault test at any scale: ``tests/test_rollout_soak.py`` runs it at 48 episodes (slow).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import soak_env  # beside this file, whose folder is on sys.path (as a script and in pytest)

from tunix_agentic.config import load_config
from tunix_agentic.envs.base import Task
from tunix_agentic.rollout.client.node_client import NodeClient
from tunix_agentic.rollout.client.runner import ServiceEpisodeRunner
from tunix_agentic.testing import TINY_MODEL_OVERRIDES, cli
from tunix_agentic.trajectory import INFRA_STATUSES

REPO = Path(__file__).resolve().parents[1]

CONFIG = str(REPO / "configs" / "calculator_tiny.yaml")
SHARED = [*TINY_MODEL_OVERRIDES, "engine.max_seq_len=128", "engine.decode_steps=2"]
START_BOUND_S = 180.0  # a server that has not said it listens by then has failed


@dataclasses.dataclass(frozen=True)
class SoakParams:
    episodes: int = 500
    group_size: int = 4
    concurrency: int = 8  # groups in flight at the client
    turns: int = 2  # tool calls per episode
    crash_rate: float = 0.10
    hang_rate: float = 0.05
    reset_fail_rate: float = 0.02  # sandbox starts that fail: infrastructure faults
    tool_timeout_s: float = 1.0
    engine_kill_at: float = 0.10  # fraction of episodes finished
    node_kill_at: float = 0.15
    rss_from: int = 100  # episode of the RSS baseline (after both restarts)
    memory_check: bool = dataclasses.field(default=True, metadata={"flag": False})
    sft_steps: int = 150

    def __post_init__(self):
        if self.episodes < self.group_size:
            raise ValueError(f"--episodes must be >= --group-size ({self.group_size})")
        if not 0 < self.engine_kill_at < 1 or not 0 < self.node_kill_at < 1:
            raise ValueError("--engine-kill-at and --node-kill-at must be fractions in (0, 1)")
        if not self.episodes * max(self.engine_kill_at, self.node_kill_at) < self.rss_from:
            raise ValueError("--rss-from must come after both kills")
        if not self.rss_from < self.episodes:
            raise ValueError("--rss-from must be below --episodes")


# ------------------------------------------------------------------ policy
def teach_policy(out: Path, p: SoakParams) -> None:
    """The tiny model, taught to answer every turn of the probe task with ``ok`` and a
    stop token; written where ``serve-engine --params`` reads it."""
    from flax import nnx

    from tunix_agentic.checkpoint import save_params
    from tunix_agentic.data.demos import demonstration_rows
    from tunix_agentic.models.hf import build_model
    from tunix_agentic.rollout.service.node import setup_from_config
    from tunix_agentic.testing import memorize

    cfg = load_config(CONFIG, SHARED)
    template = setup_from_config(cfg).template
    tools = [soak_env.ProbeTool.schema()]
    observations = ["ok", "error: RuntimeError: probe crashed (exit 139)"]
    observations.append(f"error: tool 'probe' timed out after {p.tool_timeout_s:g}s")
    rows = []
    for obs in observations:
        msgs = [{"role": "assistant", "content": "ok"}, {"role": "tool", "content": obs}]
        msgs.append({"role": "assistant", "content": "ok"})
        row = demonstration_rows(soak_env.PROMPT, msgs, template, tools=tools)
        rows.append((list(row["input_ids"]), list(row["loss_mask"])))
    model = memorize(build_model(cfg.model, seed=cfg.seed), rows, steps=p.sft_steps)
    save_params(out, nnx.state(model, nnx.Param))


# --------------------------------------------------------------- processes
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclasses.dataclass
class Server:
    """One server process, restartable on the same command line (port, state dir)."""

    name: str
    argv: list[str]
    banner: str
    log: Path
    env: dict[str, str]
    proc: subprocess.Popen | None = None
    url: str = ""

    def spawn(self) -> None:
        with open(self.log, "a") as err:
            self.proc = subprocess.Popen(
                self.argv, cwd=REPO, stdout=subprocess.PIPE, stderr=err, text=True, env=self.env
            )

    def wait_ready(self) -> str:
        ready, _, _ = select.select([self.proc.stdout], [], [], START_BOUND_S)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith(self.banner):
            self.proc.kill()
            tail = self.log.read_text()[-2000:]
            raise RuntimeError(f"{self.name} did not start: {line!r}\n{tail}")
        self.url = line.split()[-1]
        return self.url

    def sigkill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TUNIX_AGENTIC_API_KEY"}
    return {**env, "JAX_PLATFORMS": "cpu", **extra}


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def rss_verdict(
    planned_from: int, taken_at: int, episodes: int, before_kb: list[int], after_kb: list[int]
) -> dict[str, Any]:
    """The memory check: each node's RSS change from the baseline to the last episode, and
    whether the baseline measured anything. It was planned at episode ``planned_from``
    and taken at ``taken_at`` (later when the restarted servers came up late); it is on
    time when at least half of the planned span (``planned_from`` to ``episodes``) is
    still ahead of it. A late baseline fails the check with a note, never passes it."""
    change = [(b - a) / a for a, b in zip(before_kb, after_kb, strict=True)]
    on_time = episodes - taken_at >= (episodes - planned_from) / 2
    note = None
    if not on_time:
        note = (
            f"RSS baseline came late: planned at episode {planned_from}, taken at {taken_at} "
            f"of {episodes} (the restarted servers came up late); node memory was not checked"
        )
    return {
        "change": [round(x, 4) for x in change],
        "on_time": on_time,
        "within_10pct": on_time and all(abs(x) <= 0.10 for x in change),
        "measured_episodes": episodes - taken_at,
        "note": note,
    }


def processes_with(marker: str) -> list[str]:
    """Command lines of live processes running a probe command of ``marker``'s run."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                argv = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if f"# {marker}" in argv:
            found.append(f"{entry.name}: {argv[:200]}")
    return found


def sandbox_dirs(tmpdir: Path) -> list[str]:
    """Sandbox directories under ``tmpdir`` (the root's dot-files are its bookkeeping)."""
    return [str(p) for p in tmpdir.glob("tunix-sandboxes-*/[!.]*")]


# --------------------------------------------------------------------- soak
@dataclasses.dataclass
class Tally:
    episodes: int = 0  # members answered (scored or lost), in completion order
    groups: Counter = dataclasses.field(default_factory=Counter)  # index -> results returned
    problems: list[str] = dataclasses.field(default_factory=list)
    statuses: Counter = dataclasses.field(default_factory=Counter)
    tools: Counter = dataclasses.field(default_factory=Counter)
    dropped: int = 0
    lost: int = 0


def check_group(group: Any, size: int, t: Tally) -> None:
    """Infrastructure failures stay out of the group's statistics."""
    scored = [tr for tr in group.trajectories if tr.status in INFRA_STATUSES]
    if scored:
        t.problems.append(f"{group.group_id}: scored infra statuses {[x.status for x in scored]}")
    clean = [tr for tr in group.dropped if tr.status not in INFRA_STATUSES]
    if clean:
        t.problems.append(f"{group.group_id}: dropped non-infra {[x.status for x in clean]}")
    if len(group.trajectories) + group.lost != size or len(group.rewards) != len(
        group.trajectories
    ):
        t.problems.append(f"{group.group_id}: {len(group.trajectories)} scored + {group.lost} lost")
    t.dropped += len(group.dropped)
    for tr in group.dropped:
        t.statuses[f"dropped/{tr.status}"] += 1
    t.lost += group.lost
    for tr in group.trajectories:
        t.statuses[tr.status] += 1
        for step in tr.steps:
            for call in step.tool_calls:
                t.tools["calls"] += 1
                t.tools[call.get("kind") or "ok"] += 1


async def soak(p: SoakParams, work: Path) -> dict[str, Any]:
    marker = f"tunix-soak-{uuid.uuid4().hex[:10]}"
    sandbox_tmp = work / "tmp"
    sandbox_tmp.mkdir()
    policy = work / "policy"
    engine_urls = [f"http://127.0.0.1:{_free_port()}" for _ in range(2)]
    engines = []
    for i, url in enumerate(engine_urls):
        argv = cli("serve-engine", "--config", CONFIG, "--params", str(policy))
        argv += ["--port", url.rsplit(":", 1)[1], *SHARED, "engine.max_slots=16"]
        engines.append(Server(f"engine-{i}", argv, "serving on ", work / f"engine-{i}.log", _env()))
    kwargs = (
        f"{{crash_rate: {p.crash_rate}, hang_rate: {p.hang_rate}, turns: {p.turns}, "
        f"reset_fail_rate: {p.reset_fail_rate}, marker: {marker}}}"
    )
    node_overrides = [
        *SHARED,
        f"env.import={Path(soak_env.__file__).resolve()}",
        "env.name=soak_probe",
        f"env.tool_timeout_s={p.tool_timeout_s}",
        f"tasks=[{{name: soak, env: soak_probe, env_kwargs: {kwargs}}}]",
        f"rollout.group_size={p.group_size}",
        f"rollout.run_workers={p.group_size * p.concurrency}",
        "rollout.infra_retries=2",
        "rollout.infra_backoff_s=0.2",
        "rollout.infra_backoff_max_s=1",
    ]
    nodes = []
    for i in range(2):
        argv = cli("serve-rollout", "--config", CONFIG, "--port", str(_free_port()))
        argv += ["--state-dir", str(work / f"node-{i}")]
        argv += [x for url in engine_urls for x in ("--engine-url", url)] + node_overrides
        env = _env(TMPDIR=str(sandbox_tmp))
        nodes.append(
            Server(f"node-{i}", argv, "serving rollout node on ", work / f"node-{i}.log", env)
        )
    try:
        return await _soak(p, marker, sandbox_tmp, policy, engines, nodes)
    finally:
        for server in [*nodes, *engines]:
            server.stop()


async def _soak(
    p: SoakParams,
    marker: str,
    sandbox_tmp: Path,
    policy: Path,
    engines: list[Server],
    nodes: list[Server],
) -> dict[str, Any]:
    t0 = time.perf_counter()
    for n in nodes:  # they start while the policy is taught (engines are asked lazily)
        n.spawn()
    await asyncio.to_thread(teach_policy, policy, p)
    teach_s = time.perf_counter() - t0
    for e in engines:
        e.spawn()
    for server in [*engines, *nodes]:
        await asyncio.to_thread(server.wait_ready)
    node_urls = [n.url for n in nodes]
    started_s = time.perf_counter() - t0

    cfg = load_config(
        CONFIG,
        [
            *SHARED,
            f"rollout.group_size={p.group_size}",
            "rollout.service.health_every_s=0.2",
            "rollout.service.poll_s=5",
        ],
    )
    agent = dataclasses.replace(cfg.agent, max_turns=p.turns + 1, max_new_tokens=8)
    failures: list[Exception] = []  # what would stop a training run (InfraFailureError)
    runner = ServiceEpisodeRunner(
        node_urls, agent_config=agent, config=cfg.rollout, fail=failures.append
    )
    tally, figures, faults = Tally(), {}, {}
    killed_done: set[str] = set()  # groups the killed node had finished, from its log
    progressed = asyncio.Event()

    async def one(index: int, slots: asyncio.Semaphore) -> None:
        async with slots:
            task = Task(task_id=f"t{index}", prompt=soak_env.PROMPT, task_name="soak")
            group = await runner.run_group(task, index=index, version=0)
        tally.groups[index] += 1
        tally.episodes += p.group_size
        check_group(group, p.group_size, tally)
        progressed.set()

    async def restart(server: Server, what: str) -> None:
        await asyncio.to_thread(server.wait_ready)
        if what == "node":  # what it serves from its log, before it runs anything new
            faults["node"]["done_at_restart"] = (await _node_totals([server.url]))[0]["done"]
            killed_done.update(await _node_done_ids(server.url))

    async def inject() -> None:
        """SIGKILL engine 0 then node 0 at their points and restart them; RSS baseline."""
        plan = [
            (p.engine_kill_at * p.episodes, "engine"),
            (p.node_kill_at * p.episodes, "node"),
            (p.rss_from, "rss"),
        ]
        restarts = []
        for at, what in sorted(plan):
            while tally.episodes < at:
                progressed.clear()
                await progressed.wait()
            if what == "rss":
                await asyncio.gather(*restarts)
                figures["rss_from_kb"] = [rss_kb(n.proc.pid) for n in nodes]
                figures["rss_from_episode"] = tally.episodes
                continue
            server = engines[0] if what == "engine" else nodes[0]
            running = await _running_soon(server.url) if what == "node" else None
            server.sigkill()
            faults[what] = {"killed_at_episode": tally.episodes, "groups_running": running}
            server.spawn()  # same port, same state dir
            restarts.append(asyncio.ensure_future(restart(server, what)))
        await asyncio.gather(*restarts)

    try:
        await runner.connect()
        slots = asyncio.Semaphore(p.concurrency)
        n_groups = p.episodes // p.group_size
        injector = asyncio.create_task(inject())
        t_run = time.perf_counter()
        await asyncio.gather(*(one(i, slots) for i in range(n_groups)))
        run_s = time.perf_counter() - t_run
        await injector
        figures["rss_last_kb"] = [rss_kb(n.proc.pid) for n in nodes]
        engine_health = await _engine_health(node_urls, engines[0].url)
        nodes_up = await _all_up(runner)
        leftovers_idle = processes_with(marker), sandbox_dirs(sandbox_tmp)
        node_totals = await _node_totals(node_urls)
        done_on = Counter()
        for url in node_urls:
            done_on.update(await _node_done_ids(url))
    finally:
        await runner.close()
    for server in [*nodes, *engines]:
        server.stop()
    leftovers_after = processes_with(marker), sandbox_dirs(sandbox_tmp)

    outcomes = runner.outcomes
    ids = [gid for gid, _ in outcomes]
    rss = rss_verdict(
        p.rss_from,
        figures["rss_from_episode"],
        tally.episodes,
        figures["rss_from_kb"],
        figures["rss_last_kb"],
    )
    checks = {
        "one_outcome_per_group": len(ids) == len(set(ids)) == n_groups
        and sorted(tally.groups) == list(range(n_groups))
        and set(tally.groups.values()) == {1},
        "all_done_none_lost": {how for _, how in outcomes} == {"done"},
        # The nodes' own logs: each group finished on one node only (a lost one ran
        # again), but for one the killed node finished (its log says so at restart)
        # whose answer the kill cut off: resubmitted, it ran again on the other.
        "each_group_done_on_one_node": set(done_on) == set(ids)
        and all(n == 1 or (n == 2 and g in killed_done) for g, n in done_on.items()),
        "infra_out_of_group_stats": not tally.problems,
        "no_run_stopped_on_infra": not failures,
        "no_sandbox_left": not any([*leftovers_idle, *leftovers_after]),
        **(
            {"rss_baseline_on_time": rss["on_time"], "node_rss_within_10pct": rss["within_10pct"]}
            if p.memory_check
            else {}
        ),
        "restarted_engine_healthy_on_nodes": all(engine_health),
        "node_kill_hit_running_groups": bool(faults.get("node", {}).get("groups_running")),
        "killed_node_taken_back": runner.counts["nodes_taken_back"] >= 1 and nodes_up,
    }
    return {
        "groups": n_groups,
        "episodes": tally.episodes,
        "scored": sum(n for s, n in tally.statuses.items() if not s.startswith("dropped/")),
        "lost_members": tally.lost,
        "tool_calls": tally.tools["calls"],
        "tool_crashes": tally.tools["raised"],
        "hangs_cut": tally.tools["timeout"],
        "tool_ok": tally.tools["ok"],
        "statuses": dict(tally.statuses),
        "infra_failures": tally.dropped,
        "resubmissions": runner.counts["resubmitted"],
        "lost_reports": runner.counts["lost"],
        "nodes_taken_out": runner.counts["nodes_taken_out"],
        "nodes_taken_back": runner.counts["nodes_taken_back"],
        "node_groups_done": node_totals,
        "done_twice_answer_cut_by_kill": sum(1 for n in done_on.values() if n == 2),
        # Groups the restarted node ran (none at a small scale: all were placed before).
        "restarted_node_groups_done": node_totals[0]["done"]
        - faults.get("node", {}).get("done_at_restart", 0),
        "faults": faults,
        "rss_from_episode": figures["rss_from_episode"],
        "node_rss_kb": {"from": figures["rss_from_kb"], "last": figures["rss_last_kb"]},
        "node_rss_change": rss["change"],
        "rss_measured_episodes": rss["measured_episodes"],
        "rss_note": rss["note"]
        if p.memory_check
        else "node memory was not checked (--no-memory-check)",
        "leftovers": {"idle": leftovers_idle, "after_stop": leftovers_after},
        "problems": tally.problems[:10],
        "failures": [str(e) for e in failures[:5]],
        "teach_s": round(teach_s, 1),
        "start_s": round(started_s, 1),
        "run_s": round(run_s, 1),
        "episodes_per_s": round(tally.episodes / run_s, 2),
        "checks": checks,
        "ok": all(checks.values()),
    }


async def _all_up(runner: ServiceEpisodeRunner, bound_s: float = 30.0) -> bool:
    """Whether the client has every node up again (waits up to ``bound_s``)."""
    deadline = time.monotonic() + bound_s
    while not all(n["up"] for n in runner.status()):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.2)
    return True


async def _running_soon(url: str, bound_s: float = 30.0) -> int:
    """Groups running on the node at ``url``, once there are some (groups finish in waves:
    between two, a node may run nothing for a moment); 0 if none within ``bound_s``."""
    deadline = time.monotonic() + bound_s
    async with NodeClient(url) as client:
        while True:
            running = (await client.status())["groups"]["running"]
            if running or time.monotonic() > deadline:
                return running
            await asyncio.sleep(0.05)


async def _engine_health(node_urls: list[str], engine_url: str) -> list[bool]:
    """Whether every node sees ``engine_url`` healthy (waits up to 60 s for it)."""
    out = []
    for url in node_urls:
        async with NodeClient(url) as client:
            deadline = time.monotonic() + 60
            while True:
                engines = (await client.status())["engines"]
                ok = any(e["url"] == engine_url and e["healthy"] for e in engines)
                if ok or time.monotonic() > deadline:
                    out.append(ok)
                    break
                await asyncio.sleep(0.5)
    return out


async def _node_done_ids(url: str) -> list[str]:
    """The ids of the groups ``url``'s log says it finished ``done`` (all pages)."""
    ids, cursor = [], 0
    async with NodeClient(url) as client:
        while True:
            page = await client.done_since(cursor, limit=1000)
            ids += [g["group_id"] for g in page["groups"] if g["status"] == "done"]
            if not page["groups"]:
                return ids
            cursor = page["cursor"]


async def _node_totals(node_urls: list[str]) -> list[dict[str, int]]:
    out = []
    for url in node_urls:
        async with NodeClient(url) as client:
            out.append((await client.status())["groups"])
    return out


def parse_args(argv: list[str] | None) -> tuple[SoakParams, bool]:
    d = SoakParams()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for f in dataclasses.fields(SoakParams):
        if f.metadata.get("flag") is False:  # set by a flag of its own below
            continue
        flag = "--" + f.name.replace("_", "-")
        ap.add_argument(flag, type=type(getattr(d, f.name)), default=getattr(d, f.name))
    ap.add_argument("--keep", action="store_true", help="keep the work dir (logs) afterwards")
    ap.add_argument(
        "--no-memory-check",
        action="store_true",
        help="leave the RSS checks out (a short soak, whose baseline cannot come early enough "
        "to measure anything: the result says memory was not checked, never that it passed)",
    )
    args = ap.parse_args(argv)
    keep = args.__dict__.pop("keep")
    memory_check = not args.__dict__.pop("no_memory_check")
    try:
        return dataclasses.replace(SoakParams(**vars(args)), memory_check=memory_check), keep
    except ValueError as exc:
        ap.error(str(exc))


def main(argv: list[str] | None = None) -> int:
    p, keep = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="soak-rollout-"))
    try:
        result = asyncio.run(soak(p, work))
    finally:
        if keep:
            print(f"work dir kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    for name, ok in result["checks"].items():
        print(f"CHECK {name}: {'ok' if ok else 'FAILED'}")
    print(
        f"{result['groups']} groups, {result['episodes']} episodes in {result['run_s']} s "
        f"({result['episodes_per_s']}/s); {result['tool_calls']} tool calls: "
        f"{result['tool_crashes']} crashed, {result['hangs_cut']} hangs cut; "
        f"{result['resubmissions']} resubmissions, {result['infra_failures']} infra failures; "
        f"node RSS change {result['node_rss_change']} from episode {result['rss_from_episode']}"
    )
    if result["rss_note"]:
        print(f"NOTE {result['rss_note']}")
    print(json.dumps(result, sort_keys=True))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
