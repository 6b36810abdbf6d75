"""How each side of ``compare`` runs in its own process: a job file in, a result file out."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def job_main(run_job: Callable[[dict[str, Any]], dict[str, Any]], argv: list[str] | None) -> int:
    """Read the job (JSON) named by ``argv[0]``, run it, write what it returns to the
    job's ``result`` path (JSON); the process's exit code."""
    argv = sys.argv[1:] if argv is None else argv
    job = json.loads(Path(argv[0]).read_text())
    out = run_job(job)
    Path(job["result"]).write_text(json.dumps(out, indent=1))
    return 0
