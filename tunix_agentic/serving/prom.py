"""Prometheus ``GET /metrics`` for the servers, as SGLang's and vLLM's servers expose it.

:func:`add_prometheus` gives an aiohttp app a registry of its own (several servers in
one process never share or clash), a middleware that times every request by route
(``tunix_http_request_seconds``, a histogram labelled by method, route template and
status) and counts those in flight (``tunix_http_requests_in_flight``), and the
``/metrics`` route in Prometheus' text format. A server adds what it alone knows as a
*collector*, read at each scrape: :class:`EngineCollector` (requests queued and
decoding, slots used, tokens generated and reused, device-busy seconds, weight
version) and :class:`EnvCollector` (episodes open). ``/metrics`` is guarded by the
server's API key like every route but ``/health``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, Histogram
from prometheus_client import generate_latest as _exposition
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

_REGISTRY: web.AppKey[CollectorRegistry] = web.AppKey("prometheus_registry", CollectorRegistry)
# Request latency buckets: from a health probe (ms) to a long generation (minutes).
_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


def _route(request: web.Request) -> str:
    """The route's template (``/envs/{episode_id}/step``), so labels stay few; requests
    that matched no route are one label."""
    info = request.match_info
    resource = info.route.resource if info.route is not None else None
    return resource.canonical if resource is not None else "unmatched"


def add_prometheus(app: web.Application, *collectors: Any) -> CollectorRegistry:
    """Serve ``GET /metrics`` from ``app`` with request metrics and ``collectors``
    (objects with ``collect() -> Iterator[Metric]``); returns the app's registry.
    Call it before the app starts (it adds a middleware and a route)."""
    registry = CollectorRegistry()
    latency = Histogram(
        "tunix_http_request_seconds",
        "Seconds from a request's arrival to its answer, by route",
        ["method", "route", "status"],
        buckets=_BUCKETS,
        registry=registry,
    )
    in_flight = Gauge(
        "tunix_http_requests_in_flight",
        "Requests being answered now, by route",
        ["route"],
        registry=registry,
    )
    for collector in collectors:
        registry.register(collector)

    @web.middleware
    async def measure(request: web.Request, handler) -> web.StreamResponse:
        route = _route(request)
        gauge = in_flight.labels(route)
        gauge.inc()
        start, status = time.perf_counter(), 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            gauge.dec()
            latency.labels(request.method, route, str(status)).observe(time.perf_counter() - start)

    async def handle_metrics(request: web.Request) -> web.Response:
        body = _exposition(request.app[_REGISTRY])
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.middlewares.insert(0, measure)  # outermost: refused requests are measured too
    app[_REGISTRY] = registry
    app.router.add_get("/metrics", handle_metrics)
    return registry


class EngineCollector:
    """What an engine's ``health()`` says, read at each scrape (``engine`` is a
    :class:`~tunix_agentic.inference.engine.JaxEngine`, or anything with its
    ``health()`` keys)."""

    def __init__(self, engine: Any):
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        h: dict[str, Any] = self._engine.health()
        gauges = (
            ("tunix_engine_requests_queued", "Requests waiting for a slot", "queued"),
            ("tunix_engine_requests_running", "Requests holding a slot", "active"),
            ("tunix_engine_slots_parked", "Slots parked for a session's next turn", "parked"),
            ("tunix_engine_slots", "Slots the engine has", "slots"),
            ("tunix_engine_weight_version", "Version of the weights in use", "version"),
        )
        for name, doc, key in gauges:
            if key in h:
                yield GaugeMetricFamily(name, doc, value=float(h[key]))
        counters = (
            ("tunix_engine_generated_tokens", "Tokens generated", "generated_tokens"),
            ("tunix_engine_cached_tokens", "Prompt tokens reused from cached KV", "cached_tokens"),
            ("tunix_engine_busy_seconds", "Seconds a device call was running", "busy_s"),
            (
                "tunix_engine_host_gap_seconds",
                "Seconds work waited, no call running",
                "sched_gap_s",
            ),
        )
        for name, doc, key in counters:
            if key in h:
                yield CounterMetricFamily(name, doc, value=float(h[key]))
        yield GaugeMetricFamily(
            "tunix_engine_up", "1 while the engine is open", value=float(h["ok"])
        )


class EnvCollector:
    """An environment server's open episodes, read at each scrape."""

    def __init__(self, open_episodes: Callable[[], int]):
        self._open = open_episodes

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "tunix_env_episodes_open", "Episodes created and not yet closed", value=self._open()
        )
