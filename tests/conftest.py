"""Fixtures shared by the test modules."""

from __future__ import annotations

import pytest

from tunix_agentic.inference.engine import JaxEngine


@pytest.fixture
async def make_engine():
    """``make_engine(model, config, ...)``: a :class:`JaxEngine` closed when the test ends,
    passed or failed (an engine left open keeps its scheduler thread running)."""
    engines: list[JaxEngine] = []

    def make(*args, **kwargs) -> JaxEngine:
        engine = JaxEngine(*args, **kwargs)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        if not engine.closed:
            await engine.close()
