"""The one admin listener of a router with several workers: it asks each worker's admin
app (on its private Unix socket) and answers for all of them.

`/metrics` is every worker's exposition with a `worker` label added (sum over it in
PromQL), `/admin/backends` sums what workers book per backend and keeps each one's view,
`/readyz` is ready while every worker is."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from urllib.parse import quote

import aiohttp
import orjson
from aiohttp import web
from gpuroute.router.admin.fleet_view import typical_request
from gpuroute.router.admin.model_routes import AUTOSCALE_PATH, SPLIT_PATH
from gpuroute.router.core.usage import rows_of, usage_sums
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from gpuroute.admin_guard import Middleware
from gpuroute.openai_api import error_response, healthz

log = logging.getLogger("gpuroute.router.workers.parent")
ASK_TIMEOUT_S = 5.0
# the admin API's changes, told to every worker (router/admin/api.py)
WRITES = (
    ("POST", "/admin/reload"),
    ("POST", "/admin/backends"),
    ("POST", "/admin/backends/{id}/drain"),
    ("DELETE", "/admin/backends/{id}"),
    ("POST", "/admin/keys"),
    ("DELETE", "/admin/keys/{sha256}"),
)
SUMMED = ("in_flight", "outstanding_s")


class MergedMetrics:
    """A collector over the workers' last scrape: families merged by name, each sample
    labelled with the worker it came from."""

    def __init__(self, texts: Sequence[str | None], extra: Sequence[Metric] = ()) -> None:
        self.texts, self.extra = texts, extra

    def collect(self):
        merged: dict[str, Metric] = {}
        for worker, text in enumerate(self.texts):
            if text is None:
                continue
            for family in text_string_to_metric_families(text):
                into = merged.setdefault(
                    family.name, Metric(family.name, family.documentation, family.type)
                )
                for s in family.samples:
                    into.add_sample(s.name, {**s.labels, "worker": str(worker)}, s.value)
        yield from merged.values()
        yield from self.extra


def merge_metrics(texts: Sequence[str | None], extra: Sequence[Metric] = ()) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MergedMetrics(texts, extra))
    return generate_latest(registry)


def merge_backends(views: Sequence[dict | None]) -> dict:
    """The first answering worker's rows, with each backend's in-flight requests and booked
    work summed over all workers; every worker's own view under `workers`."""
    answered = [v for v in views if v is not None]
    if not answered:
        return {"backends": [], "workers": []}
    rows = {r["id"]: {**r, **dict.fromkeys(SUMMED, 0)} for r in answered[0].get("backends", [])}
    for view in answered:
        for r in view.get("backends", []):
            if r["id"] in rows:
                for key in SUMMED:
                    rows[r["id"]][key] = round(rows[r["id"]][key] + r.get(key, 0), 4)
    body = {k: v for k, v in answered[0].items() if k != "backends"}
    body["backends"] = list(rows.values())
    body["workers"] = [None if v is None else {"worker": i, **v} for i, v in enumerate(views)]
    return body


def merge_usage(bodies: Sequence[dict]) -> dict:
    """Workers' own usage answers (no Redis) summed into one, with the first's window."""
    rows = [row for body in bodies for row in rows_of(body)]
    head = {k: v for k, v in bodies[0].items() if k not in ("tenants", "total")}
    return head | usage_sums(rows)


class WorkerAdmin:
    """The parent's admin application. `sockets`: each worker's admin socket; `status`:
    the parent's own gauges (workers up, restarts); `unready`: why the parent itself is
    not serving ("starting" until every worker has started, "draining" once stopping), or
    None."""

    def __init__(
        self,
        sockets: Callable[[], Sequence[Path]],
        status: Callable[[], Sequence[Metric]],
        unready: Callable[[], str | None],
    ) -> None:
        self.sockets, self.status, self.unready = sockets, status, unready

    def app(self, middlewares: Sequence[Middleware] = ()) -> web.Application:
        app = web.Application(middlewares=middlewares)
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/admin/backends", self.backends)
        app.router.add_get("/admin/explain/{request_id}", self.explain)
        app.router.add_get("/admin/models", self.models)
        app.router.add_put(SPLIT_PATH, self.every)
        for method, path in WRITES:
            app.router.add_route(method, path, self.every)
        # every worker sizes on the same shared rates: the first one's answer stands
        for path in ("/admin/config", "/admin/keys", AUTOSCALE_PATH):
            app.router.add_get(path, self.first)
        app.router.add_get("/admin/usage", self.usage)
        app.router.add_post("/admin/usage/flush", self.every)
        return app

    async def ask(
        self, socket: Path, path: str, method: str = "GET", body: bytes | None = None
    ) -> tuple[int, bytes] | None:
        """One worker's answer, or None when it is down or too slow."""
        timeout = aiohttp.ClientTimeout(total=ASK_TIMEOUT_S)
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            connector = aiohttp.UnixConnector(path=str(socket))
            async with (
                aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
                session.request(method, f"http://worker{path}", data=body) as response,
            ):
                return response.status, await response.read()
        return None

    async def ask_all(
        self, path: str, method: str = "GET", body: bytes | None = None
    ) -> list[tuple[int, bytes] | None]:
        asks = (self.ask(s, path, method, body) for s in self.sockets())
        return list(await asyncio.gather(*asks))

    async def first(self, request: web.Request) -> web.Response:
        """What the first answering worker says (they all hold the same); a refusal they
        all make (a 404 for what is switched off) as it came."""
        answers = [a for a in await self.ask_all(request.path) if a is not None]
        for status, body in sorted(answers, key=lambda a: a[0] != 200):
            if status < 500:
                return web.Response(status=status, body=body, content_type="application/json")
        return error_response(503, "no worker answered", code="worker_down")

    async def models(self, request: web.Request) -> web.Response:
        return await self.first(request)

    async def every(self, request: web.Request) -> web.Response:
        """A change told to every worker (a split, a reload, a backend, a key); 502 unless
        each one took it (the change is then partial: send it again), or the first
        refusal."""
        answers = await self.ask_all(request.path, request.method, await request.read())
        if refused := first_refusal(answers, 502, "did not answer; send the change again"):
            return refused
        status, body = answers[0]  # type: ignore[misc]
        return web.Response(status=status, body=body, content_type="application/json")

    async def reload_all(self) -> None:
        """SIGHUP to the parent: every worker re-reads the file; refusals are logged."""
        for worker, answer in enumerate(await self.ask_all("/admin/reload", "POST")):
            if answer is None or answer[0] != 200:
                why = "no answer" if answer is None else answer[1].decode(errors="replace")
                log.error("SIGHUP: worker %d did not reload: %s", worker, why)
            else:
                log.info("SIGHUP: worker %d reloaded", worker)

    async def readyz(self, _request: web.Request) -> web.Response:
        if (why := self.unready()) is not None:
            return error_response(503, why, code=why)
        answers = await self.ask_all("/readyz")
        if refused := first_refusal(answers, 503, "is down"):
            return refused
        first = orjson.loads(answers[0][1])  # every worker answered 200
        return web.json_response({**first, "workers": len(answers)})

    async def metrics(self, _request: web.Request) -> web.Response:
        answers = await self.ask_all("/metrics")
        texts = [a[1].decode() if a and a[0] == 200 else None for a in answers]
        body = merge_metrics(texts, self.status())
        return web.Response(body=body, content_type="text/plain", charset="utf-8")

    async def explain(self, request: web.Request) -> web.Response:
        """A request is served by one worker: the first that kept it answers."""
        request_id = request.match_info["request_id"]
        for answer in await self.ask_all(f"/admin/explain/{quote(request_id, safe='')}"):
            if answer is not None and answer[0] == 200:
                return web.Response(body=answer[1], content_type="application/json")
        message = "the request is not among the recent ones any worker kept"
        return error_response(404, message, code="request_not_found")

    async def backends(self, request: web.Request) -> web.Response:
        """Predictions (`?prompt_tokens=`) come from the first answering worker's model."""
        try:
            typical_request(request.query)
        except ValueError as exc:
            return error_response(400, str(exc), code="bad_request")
        query = f"?{request.query_string}" if request.query_string else ""
        answers = await self.ask_all("/admin/backends" + query)
        views = [orjson.loads(a[1]) if a and a[0] == 200 else None for a in answers]
        return web.json_response(merge_backends(views))

    async def usage(self, request: web.Request) -> web.Response:
        """Every worker's counts flushed; then, with Redis, one worker reads the shared
        record for all, and without it each holds its own, and their answers are summed."""
        flushed = await self.ask_all("/admin/usage/flush", "POST")
        if refused := first_refusal(flushed, 502, "did not flush: its usage would be missing"):
            return refused
        shared = orjson.loads(flushed[0][1])["shared"]  # type: ignore[index]
        query = f"/admin/usage?{request.query_string}"
        if shared:  # every worker reads the same record: one is asked
            answers = [await self.ask(self.sockets()[0], query)]
        else:
            answers = await self.ask_all(query)
        if refused := first_refusal(answers, 502, "did not answer: its usage would be missing"):
            return refused
        bodies = [orjson.loads(a[1]) for a in answers]  # (every worker answered)
        return web.json_response(bodies[0] if shared else merge_usage(bodies))


def first_refusal(
    answers: list[tuple[int, bytes] | None], status: int, missing: str
) -> web.Response | None:
    """None when every worker answered below 300; else the first worker's refusal as it
    came, or `status` naming the first worker that did not answer (`missing`: why it
    matters)."""
    if not answers:
        return error_response(status, "no worker answered", code="worker_down")
    for worker, answer in enumerate(answers):
        if answer is None:
            return error_response(status, f"worker {worker} {missing}", code="worker_down")
        if answer[0] >= 300:
            return web.Response(status=answer[0], body=answer[1], content_type="application/json")
    return None
