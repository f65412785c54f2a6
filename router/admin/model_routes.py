"""Admin endpoints for the model table: what each name resolves to, and a split's weights
changed at run time (a canary's rollout or rollback, effective from the next request)."""

from __future__ import annotations

import orjson
from aiohttp import web
from gpuroute.router.admin.api import Operator
from gpuroute.router.admin.fleet_view import describe_backends, typical_request
from gpuroute.router.admin.reload import Running
from gpuroute.router.backends.membership import Membership
from gpuroute.router.core.backend import ROUTABLE_STATES, BackendSet
from gpuroute.router.core.model_routes import ModelRouteError, ModelRoutes

from gpuroute.openai_api import clip, error_response

SPLIT_PATH = "/admin/models/{name}/split"
AUTOSCALE_PATH = "/admin/autoscale"


def describe_models(routes: ModelRoutes, backends: BackendSet) -> dict:
    """Each routed name: its versions and weights, its fallbacks, and how many routable
    backends serve each version; and the aliases."""
    routable: dict[str, int] = {}
    for b in backends:
        if b.state in ROUTABLE_STATES:
            for m in b.models:
                routable[m] = routable.get(m, 0) + 1
    models = {
        name: {
            "split": dict(route.split),
            "fallback": list(route.fallback),
            "routable_backends": {
                m: routable.get(m, 0) for m in ([v for v, _ in route.split] or [name])
            },
        }
        for name, route in routes.routes.items()
    }
    return {"models": models, "aliases": dict(routes.aliases)}


class AdminRoutes:
    """The router's own admin endpoints besides /metrics: backends, explain, models."""

    def __init__(
        self, router: Running, operator: Operator, membership: Membership | None = None
    ) -> None:
        self.router, self.operator, self.membership = router, operator, membership
        self.routes: ModelRoutes = router.routes

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/admin/backends", self.backends)
        app.router.add_get("/admin/explain/{request_id}", self.explain)
        app.router.add_get("/admin/models", self.models)
        app.router.add_get(AUTOSCALE_PATH, self.autoscale)
        app.router.add_put(SPLIT_PATH, self.put_split)
        self.operator.add_routes(app)  # reload, backends, keys, config

    async def explain(self, request: web.Request) -> web.Response:
        """What the decision log kept of one recent request (`gpuroute explain`)."""
        request_id = request.match_info["request_id"]
        events = self.router.decisions.explain(request_id)
        if not events:
            message = f"request {clip(request_id)!r} is not among the recent ones kept here"
            return error_response(404, message, code="request_not_found")
        return web.json_response({"request_id": request_id, "events": events})

    async def backends(self, request: web.Request) -> web.Response:
        try:
            typical = typical_request(request.query)
        except ValueError as exc:
            return error_response(400, str(exc), code="bad_request")
        r = self.router
        return web.json_response(
            describe_backends(r.scheduler, r.config, self.membership, r.clock(), typical)
        )

    async def autoscale(self, _request: web.Request) -> web.Response:
        """Each pool's desired size and why (`gpuroute scale` follows it)."""
        autoscaler = self.router.autoscaler
        if not autoscaler.config.enabled:
            message = "autoscale.enabled is false: this router does not size its pools"
            return error_response(404, message, code="autoscale_disabled")
        return web.json_response(autoscaler.describe())

    async def models(self, _request: web.Request) -> web.Response:
        return web.json_response(describe_models(self.routes, self.router.scheduler.backends))

    async def put_split(self, request: web.Request) -> web.Response:
        """`{"split": {"m@v1": 100, "m@v2": 0}}`: the versions' new weights (all of them,
        adding up to 100), from the next request on. Sessions keep their version unless
        the weight moved their bucket to another."""
        name = request.match_info["name"]
        try:
            body = orjson.loads(await request.read())
            pairs = [(str(k), float(v)) for k, v in body["split"].items()]
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            message = 'expected a JSON object {"split": {"VERSION": PERCENT, ...}}'
            return error_response(400, message, code="bad_request")
        try:
            route = self.routes.set_split(name, pairs)
        except ModelRouteError as exc:
            status = 404 if name not in self.routes.routes else 400
            return error_response(status, clip(str(exc), 300), code="bad_split")
        return web.json_response({"model": name, "split": dict(route.split)})
