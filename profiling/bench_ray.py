"""The calculator workload through two Ray-placed rollout nodes, beside two hand-started
nodes and in process (issue 37): throughput ratios from one run, printed, never asserted.

The workload is ``profiling.bench_rollout``'s async mode (the trainer's RL loop over the
warm-started tiny calculator model, the slow environment of ``profiling.bench_env``), run
four times in one process: in process; through two ``serve-rollout`` processes started by
hand; through two nodes started by :class:`tunix_agentic.cluster.fleet.RayRolloutNodes` as
Ray actors on a local three-node cluster (a head and two workers offering ``rollout: 1``,
started here); in process again. Each service run is printed as a ratio to the faster
in-process run. Everything is on this machine, on loopback.

    nice python -m profiling.bench_ray                      # bench_rollout's flags apply
    nice python -m profiling.bench_ray --trajectories 128   # shorter
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from profiling.bench_rollout import (
    CONFIG,
    REPO,
    BenchParams,
    _spawn_node,
    _url_of,
    parse_args,
    prepare_policy,
    run_async,
)
from tunix_agentic.agent.chat import ChatTemplate
from tunix_agentic.config import load_config, to_dict
from tunix_agentic.models.char_tokenizer import CharTokenizer
from tunix_agentic.rollout.config import RayConfig
from tunix_agentic.serving.engine_server import start_server


def node_overrides(p: BenchParams) -> list[str]:
    """The overrides ``_spawn_node`` gives a hand-started node (the same slow environment)."""
    w = p.waits
    source = (
        "tasks=[{name: arithmetic, env: bench_slow_arithmetic, tasks_from: arithmetic, "
        f"env_kwargs: {{reset_s: {w.reset_s}, tool_mean_s: {w.tool_mean_s}, "
        f"tool_sigma: {w.tool_sigma}, eval_s: {w.eval_s}, seed: {p.seed}}}}}]"
    )
    return [
        *p.overrides,
        "env.import=profiling.bench_env",
        source,
        f"rollout.group_size={p.group_size}",
        *(f"rollout.{k}_workers={p.pool}" for k in ("init", "run", "eval")),
        f"rollout.seed={p.seed}",
    ]


async def run(p: BenchParams) -> dict[str, Any]:
    import ray
    from ray.cluster_utils import Cluster

    from tunix_agentic.cluster.errors import NAMESPACE
    from tunix_agentic.cluster.fleet import RayRolloutNodes

    # The actors import profiling.bench_env: the workers Ray starts inherit this path.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])
    )
    os.environ["TUNIX_AGENTIC_API_KEY"] = api_key = secrets.token_urlsafe(24)
    os.environ["TUNIX_AGENTIC_ADMIN_KEY"] = admin_key = secrets.token_urlsafe(24)
    cfg = load_config(CONFIG, p.overrides)
    template = ChatTemplate(CharTokenizer(cfg.model.vocab_size))
    engine, trainer, _, _ = await prepare_policy(p, cfg, template)
    params = trainer.state.params_for_model()
    bound = p.max_staleness[0]
    server, port = await start_server(engine)
    engine_url = f"http://127.0.0.1:{port}"
    results: dict[str, float] = {}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    procs: list[subprocess.Popen] = []
    fleet = None
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=1, resources={"rollout": 1})
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, namespace=NAMESPACE)
        first = await run_async(engine, template, p, params, engine.version, bound)
        print(first.line())
        results["in_process"] = first.traj_per_s
        with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
            # Loopback, without an API key (_spawn_node drops it), this admin key from the
            # environment: the same keys open them and the Ray-placed ones.
            procs = [_spawn_node(p, Path(tmp) / f"node-{i}") for i in range(2)]
            hand = await run_async(
                engine,
                template,
                p,
                params,
                engine.version,
                bound,
                nodes=[_url_of(proc) for proc in procs],
                engine_url=engine_url,
            )
            print(hand.line().replace("RESULT", "RESULT hand-started nodes", 1))
            results["hand_2"] = hand.traj_per_s
            node_cfg = load_config(CONFIG, node_overrides(p))
            fleet = RayRolloutNodes(
                RayConfig(nodes=2, node_resources={"rollout": 1}, state_root=tmp),
                name=f"bench-{os.getpid()}",
                config=to_dict(node_cfg),
                api_key=api_key,
                admin_key=admin_key,
                log=print,
            )
            placed = await asyncio.to_thread(fleet.start)
            on_ray = await run_async(
                engine,
                template,
                p,
                params,
                engine.version,
                bound,
                nodes=[pl.url for pl in placed],
                engine_url=engine_url,
            )
            print(on_ray.line().replace("RESULT", "RESULT Ray-placed nodes", 1))
            results["ray_2"] = on_ray.traj_per_s
            await fleet.close()
            fleet = None
        again = await run_async(engine, template, p, params, engine.version, bound)
        print(again.line().replace("RESULT", "RESULT again", 1))
        results["in_process_again"] = again.traj_per_s
    finally:
        if fleet is not None:
            await fleet.close()
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        await server.cleanup()
        await engine.close()
        ray.shutdown()
        cluster.shutdown()
    best = max(results["in_process"], results["in_process_again"])
    print(
        f"RATIO to the faster in-process run ({results['in_process']:.2f}, "
        f"{results['in_process_again']:.2f} traj/s): two hand-started nodes "
        f"{results['hand_2'] / best:.2f}x, two Ray-placed nodes {results['ray_2'] / best:.2f}x; "
        f"Ray-placed / hand-started {results['ray_2'] / results['hand_2']:.2f}x"
    )
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
