"""The default run through a rollout node whose only engine is SIGKILLed mid-run (issue 32).

Real processes on loopback: one ``tunix-agentic serve-engine`` (random weights at start;
``--weights-dir`` lets it load what the trainer publishes), one ``tunix-agentic
serve-rollout`` node, and ``tunix-agentic train`` (the default recipe,
configs/calculator_tiny.yaml, unchanged) with ``rollout.service.urls`` naming the node
and ``rollout.service.engine_urls`` naming the engine: the trainer writes each version
under ``rollout.service.weights_dir`` and the engine loads it from there.

Once the run's ``metrics.jsonl`` holds RL step ``--kill-after`` (8), the engine is
SIGKILLed, and ``--down-s`` (3) seconds later restarted on the same port (with its random
weights, version 0: the node must have it load the published version before using it).
The run then finishes. Printed: held-out success before and after RL (the trainer's
lines), whether every RL step 1..N is in ``metrics.jsonl`` exactly once, the
infrastructure failures (the trainer's ``rollout/infra_failures`` counts and the node's
own), the restarted engine's weight version against the run's last, and the verdict
against the acceptance: held-out success after RL >= 0.9, every RL step logged once, the
trainer exited 0. Exit status 0 on PASS, 1 on FAIL.

    nice python tests/soak_engine_kill.py                  # ~5-10 min on 2 shared cores
    nice python tests/soak_engine_kill.py --keep           # keep the work dir (logs, run)

A fault test: ``tests/test_rollout_soak.py`` runs it as a ``heavy`` test (past CI's budget,
deselected by default: ``pytest -m heavy``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from soak_rollout import CONFIG, REPO, Server, _env, _free_port

from tunix_agentic.config import load_config
from tunix_agentic.testing import cli

ACCEPT_SUCCESS = 0.9


def rl_steps(metrics: Path) -> Counter:
    """How many ``metrics.jsonl`` lines carry each RL step's learner figures."""
    seen: Counter = Counter()
    if not metrics.exists():
        return seen
    for line in metrics.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line being written
        if any(k.startswith("learner/") for k in row):
            seen[int(row["step"])] += 1
    return seen


def infra_counted(metrics: Path) -> float:
    """The trainer's ``rollout/infra_failures`` counts, summed over the run."""
    total = 0.0
    for line in metrics.read_text().splitlines() if metrics.exists() else []:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        total += sum(
            v or 0.0
            for k, v in row.items()
            if k.endswith("rollout/infra_failures") and isinstance(v, int | float)
        )
    return total


def get_json(url: str, timeout: float = 10.0) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # loopback only
        return json.loads(r.read())


def held_out(log: str) -> tuple[float | None, float | None]:
    """Held-out success before and after RL, from the trainer's summary line."""
    for line in log.splitlines():
        if line.startswith("held-out success: ") and "->" in line:
            before, _, rest = line.removeprefix("held-out success: ").partition(" -> ")
            return float(before), float(rest.split()[0])
    return None, None


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    weights = work / "weights"
    weights.mkdir()
    port = _free_port()
    engine_url = f"http://127.0.0.1:{port}"
    engine = Server(
        "engine",
        [
            *cli("serve-engine", "--config", CONFIG, "--port", str(port)),
            *("--weights-dir", str(weights)),
        ],
        "serving on ",
        work / "engine.log",
        _env(),
    )
    node = Server(
        "node",
        cli(
            "serve-rollout",
            *("--config", CONFIG, "--port", str(_free_port())),
            *("--state-dir", str(work / "node")),
        ),
        "serving rollout node on ",
        work / "node.log",
        _env(),
    )
    run_dir = work / "run"
    metrics = run_dir / "tensorboard" / "metrics.jsonl"
    trainer_log = work / "train.log"
    trainer = None
    fault: dict[str, Any] = {}
    t0 = time.monotonic()
    deadline = t0 + args.timeout_s
    try:
        engine.spawn()
        node.spawn()
        engine.wait_ready()
        node.wait_ready()
        argv = cli(
            "train",
            f"run_dir={run_dir}",
            f"rollout.service.urls=[{node.url}]",
            f"rollout.service.engine_urls=[{engine_url}]",
            f"rollout.service.weights_dir={weights}",
            *args.overrides,
        )
        with open(trainer_log, "w") as out:
            trainer = subprocess.Popen(
                argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=_env()
            )
        while trainer.poll() is None and not fault:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no RL step {args.kill_after} within {args.timeout_s} s")
            steps = rl_steps(metrics)
            if steps and max(steps) >= args.kill_after:
                fault["killed_after_step"] = max(steps)
                fault["killed_at_s"] = round(time.monotonic() - t0, 1)
                engine.sigkill()
                time.sleep(args.down_s)
                engine.spawn()  # same port, random weights (version 0)
                engine.wait_ready()
                fault["engine_back_after_s"] = round(
                    time.monotonic() - t0 - fault["killed_at_s"], 1
                )
                print(f"engine killed after RL step {fault['killed_after_step']}, restarted")
            time.sleep(0.2)
        try:
            rc = trainer.wait(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            rc = None  # timed out: stopped in finally
        node_status = get_json(f"{node.url}/v1/status")
        engine_info = get_json(f"{engine_url}/get_model_info")
    finally:
        if trainer is not None and trainer.poll() is None:
            trainer.terminate()
            try:
                trainer.wait(timeout=30)
            except subprocess.TimeoutExpired:
                trainer.kill()
                trainer.wait()
        node.stop()
        engine.stop()

    log = trainer_log.read_text()
    before, after = held_out(log)
    seen = rl_steps(metrics)
    n = args.rl_steps
    once = {s: seen.get(s, 0) for s in range(1, n + 1)}
    versions = [int(engine_info.get("weight_version", -1))]
    checks = {
        "trainer_exit_0": rc == 0,
        "engine_killed_after_step": fault.get("killed_after_step", 0) >= args.kill_after
        and fault.get("killed_after_step", n) < n,
        f"held_out_after_ge_{ACCEPT_SUCCESS}": after is not None and after >= ACCEPT_SUCCESS,
        "every_rl_step_once": set(once.values()) == {1} and set(seen) <= set(once),
    }
    return {
        "held_out_before": before,
        "held_out_after": after,
        "rl_steps_logged": len(seen),
        "steps_not_once": {s: c for s, c in once.items() if c != 1},
        "steps_beyond_n": sorted(set(seen) - set(once)),
        "infra_failures_trainer": infra_counted(metrics),
        "infra_failures_node": node_status.get("infra_failures"),
        "node_groups": node_status.get("groups"),
        "node_engines": node_status.get("engines"),
        "engine_version_at_end": versions[0],
        "fault": fault,
        "trainer_rc": rc,
        "wall_s": round(time.monotonic() - t0, 1),
        "summary_lines": [x for x in log.splitlines() if x.startswith("held-out")],
        "checks": checks,
        "ok": all(checks.values()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kill-after", type=int, default=8, help="RL step after which to kill")
    ap.add_argument("--down-s", type=float, default=3.0, help="seconds the engine stays down")
    ap.add_argument("--timeout-s", type=float, default=3000.0, help="bound on the whole run")
    ap.add_argument("--keep", action="store_true", help="keep the work dir afterwards")
    ap.add_argument("overrides", nargs="*", help="dotted overrides for the trainer")
    args = ap.parse_args(argv)
    args.rl_steps = load_config(CONFIG, list(args.overrides)).rl.steps
    work = Path(tempfile.mkdtemp(prefix="soak-engine-kill-"))
    try:
        result = run(args, work)
    finally:
        if args.keep:
            print(f"work dir kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    for line in result["summary_lines"]:
        print(line)
    print(
        f"held-out success before {result['held_out_before']}, after {result['held_out_after']}; "
        f"RL steps logged {result['rl_steps_logged']}/{args.rl_steps}, not once: "
        f"{result['steps_not_once'] or 'none'}; infrastructure failures: "
        f"{result['infra_failures_trainer']:g} (trainer), {result['infra_failures_node']} (node); "
        f"engine at v{result['engine_version_at_end']} at the end"
    )
    for name, ok in result["checks"].items():
        print(f"CHECK {name}: {'ok' if ok else 'FAILED'}")
    print(json.dumps(result, sort_keys=True, default=str))
    print("PASS" if result["ok"] else "FAIL")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
