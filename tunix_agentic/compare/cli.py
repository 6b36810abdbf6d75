"""``tunix-agentic compare --config RUN.yaml --against trl [--steps N] [--out DIR]
[key.path=value ...]``: the sub-command (registered in :mod:`tunix_agentic.cli.main`)."""

from __future__ import annotations

import argparse
import sys


def add_compare(sub) -> None:
    from tunix_agentic.compare.run import PEERS

    cp = sub.add_parser(
        "compare",
        help="train the same model, tasks and settings with ours and with TRL's GRPOTrainer, "
        "side by side (needs: pip install -e .[compare]; --against tunix: not built, see its error)",
    )
    cp.add_argument("--config", required=True, help="YAML run config (model.source: hf)")
    cp.add_argument(
        "--against",
        required=True,
        metavar="PEER",
        help=f"the PyTorch peer to compare with: {', '.join(PEERS)}",
    )
    cp.add_argument("--steps", type=int, default=5, help="RL steps on each side (default 5)")
    cp.add_argument(
        "--heldout",
        type=int,
        default=8,
        metavar="N",
        help="held-out tasks both policies are evaluated on before RL and after every step "
        "(rl.eval_temperature; 0: none; default 8)",
    )
    cp.add_argument("--out", default="runs/compare", metavar="DIR", help="where the report goes")
    cp.add_argument(
        "--threads",
        type=int,
        default=None,
        help="intra-op threads of both sides (default: the CPUs this process may use)",
    )
    cp.add_argument(
        "--omp-wait-policy",
        choices=("passive", "active", "default"),
        default="default",
        help="OpenMP wait policy of both processes (default: unset, as torch's users run "
        "it; passive: idle threads sleep, fairer to torch on a shared machine)",
    )
    cp.add_argument(
        "--busy-share",
        type=float,
        default=0.10,
        help="timing rows say 'machine busy: not a comparison' when other processes used more "
        "than this share of the CPUs during either side's run (0.10)",
    )
    cp.add_argument(
        "overrides", nargs="*", help="dotted overrides for both sides, e.g. model.path=DIR"
    )
    cp.set_defaults(handler=_compare)


def _compare(args: argparse.Namespace) -> int:
    from tunix_agentic.compare.run import compare
    from tunix_agentic.config import ConfigError

    try:
        compare(
            args.config,
            against=args.against,
            steps=args.steps,
            out_dir=args.out,
            heldout=args.heldout,
            overrides=args.overrides,
            threads=args.threads,
            omp_wait_policy=args.omp_wait_policy,
            busy_share=args.busy_share,
        )
    except (ConfigError, ImportError, ValueError, FileNotFoundError) as exc:
        print(f"tunix-agentic: error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # a side failed: its log's tail says why
        print(f"tunix-agentic: compare failed: {exc}", file=sys.stderr)
        return 1
    return 0
