"""``tunix-agentic aot --config RUN.yaml --topology v5e:2x4 [--json FILE] [--all-shapes]
[--fit] [key.path=value ...]``: compile the run's programs for a TPU that is not here,
print each one's memory and honest count, one RL step's floor, and with ``--fit`` the
largest settings that fit.

Exit 0 when every program fits its chips' HBM (the compiler's limit), 3 when one does not (named, with how far
over and what would help), 2 for a config, topology or mesh that cannot be compiled."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

EXIT_DOES_NOT_FIT = 3


def add_aot(sub: Any) -> None:
    """Register ``aot`` on the CLI's sub-parsers."""
    ap = sub.add_parser(
        "aot",
        help="compile the run's programs ahead of time for a TPU topology: memory, FLOPs, fit",
    )
    ap.add_argument("--config", required=True, help="YAML run config")
    ap.add_argument(
        "--topology",
        required=True,
        help="libtpu topology name: v5e:2x4 (v5e-8), v5p:2x2x1 (v5p-8), v6e:2x4 (v6e-8), v5e:1x1",
    )
    ap.add_argument("--json", metavar="FILE", default=None, help="also write the report as JSON")
    ap.add_argument(
        "--all-shapes",
        action="store_true",
        help="compile every prefill and decode shape the engine warms up (default: the "
        "largest of each, which set its peak memory and slowest step)",
    )
    ap.add_argument(
        "--fit",
        action="store_true",
        help="then search the largest learner.micro_batch_rows, rollout.groups_per_batch and "
        "engine.max_slots that fit (doubling each from the recipe's; a compile a try)",
    )
    ap.add_argument("overrides", nargs="*", help="dotted overrides, e.g. model.path=DIR")
    ap.set_defaults(handler=aot_main)


def aot_main(args: argparse.Namespace) -> int:
    from tunix_agentic.aot.compile import run_programs
    from tunix_agentic.aot.estimate import rl_step
    from tunix_agentic.aot.topology import AotError, get_topology
    from tunix_agentic.config import ConfigError, load_config, resolve_model

    start = time.perf_counter()
    try:
        cfg = resolve_model(load_config(args.config, list(args.overrides)))
        topo = get_topology(args.topology)
        report = run_programs(
            cfg,
            topo,
            all_shapes=args.all_shapes,
            log=lambda line: print(line, file=sys.stderr, flush=True),
        )
    except (ConfigError, AotError, FileNotFoundError) as exc:
        print(f"tunix-agentic: error: {exc}", file=sys.stderr)
        return 2
    print(report.table())
    estimate = rl_step(cfg, report)
    if estimate is not None:
        print("\n".join(estimate.lines()))
    cpu = sum(p.compile_s for p in report.programs)
    print(
        f"compiled {len(report.programs)} programs: {cpu:.0f}s CPU compiling, "
        f"{time.perf_counter() - start:.0f}s wall in all"
    )
    if args.json:
        doc = report.to_json()
        if estimate is not None:
            doc["rl_step_s"] = estimate.seconds
            doc["rl_step_terms"] = estimate.terms
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    if args.fit:
        from tunix_agentic.aot.fit import search

        print("largest settings that fit, each knob alone (--fit):")
        log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
        for fit in search(args.config, list(args.overrides), topo, log):
            print(f"  {fit.line()}")
    if not report.fits:
        for line in report.over():
            print(f"does not fit: {line}", file=sys.stderr)
        return EXIT_DOES_NOT_FIT
    return 0
