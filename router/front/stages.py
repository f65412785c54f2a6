"""The front stages of a request, in the order a client hears of them: who are you (401, 403),
is the body readable and valid (413, 400), is the model here (404, 503), is the tenant within
its quota (429), and a slot in the admission queue (429, 504). Each refuses with a Rejection;
nothing here has touched a backend."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from aiohttp import web
from gpuroute.router.api.request_ids import CLIENT_REQUEST_ID, named, new_request_id, own_id
from gpuroute.router.attempts.exchange import NO_BACKEND, Answer
from gpuroute.router.config.body_fields import RouterOnlyField, check_fields
from gpuroute.router.config.router import RouterConfig
from gpuroute.router.core.backend import BackendSet
from gpuroute.router.core.lifetime import Event, LifetimeError, Lifetimes, RequestLifetime
from gpuroute.router.core.model_routes import ModelRoutes
from gpuroute.router.core.request import RequestInfo
from gpuroute.router.front.admission import AdmissionGate
from gpuroute.router.front.parse import (
    PRIORITY_HEADER,
    ParsedRequest,
    RequestError,
    audio_charge,
    json_object,
    parse_request,
)
from gpuroute.router.front.residency import ResidencyGate
from gpuroute.router.front.slo import SloGate
from gpuroute.router.front.tenant import TenantGate
from gpuroute.router.observe.decision_log import DecisionLog
from gpuroute.router.observe.tracing_spans import admission
from gpuroute.router.responses.state import RESPONSES, ResponsesState
from gpuroute.router.scaling.autoscaler import Autoscaler
from gpuroute.router.shared.quotas import KeyPolicy
from gpuroute.router.usage.records import UsageRecords
from gpuroute.router.usage.tokens import TokenCounter

from gpuroute.forwarded import TrustedProxies
from gpuroute.headers import FALLBACK_HEADER, FORWARDED_FOR, interpreted
from gpuroute.openai_api import Rejection, clip, read_body

# the model a request named, for the metrics of one refused before it was admitted
MODEL_ASKED = web.RequestKey("gpuroute.model_asked", str)


@dataclass(slots=True)
class Admitted:
    """A request past the front stages: what was parsed, the body to forward as it came,
    and the headers as the router read them (gpuroute/headers.py)."""

    parsed: ParsedRequest
    raw: bytes
    headers: Mapping[str, str]
    key: KeyPolicy  # the caller's key (or the anonymous tenant's)
    charged_tokens: int  # taken from its token quota at admission, settled at the end
    life: RequestLifetime  # everything booked for it from here on


class Front:
    def __init__(
        self,
        config: RouterConfig,
        backends: BackendSet,
        tenants: TenantGate,
        gate: AdmissionGate,
        residency: ResidencyGate,
        slo: SloGate,
        lifetimes: Lifetimes,
        decisions: DecisionLog,
        *,
        offer_room: Callable[[], None],
        with_prefix_blocks: bool,
        routes: ModelRoutes | None = None,
        responses: ResponsesState | None = None,
        usage: UsageRecords | None = None,
        autoscaler: Autoscaler | None = None,
    ) -> None:
        self.config, self.backends = config, backends
        self.lifetimes = lifetimes
        self.residency = residency
        self.slo = slo
        self.tenants, self.gate = tenants, gate
        self.proxies = TrustedProxies(config.trusted_proxies)
        # hashing every prompt's blocks is wasted work unless the policy reads them
        self.with_prefix_blocks = with_prefix_blocks
        self.decisions = decisions  # refusals are written there, with the request's id
        self.offer_room = offer_room  # a booking freed: room for requests held for their SLO
        self.routes = routes or ModelRoutes()  # aliases, splits, fallbacks ([[models]])
        self.model_slo = {m.name: m.slo_class for m in config.models if m.slo_class}
        self.responses = responses  # the Responses API's stored conversations, if kept
        self.token_counter = TokenCounter(tenants.metrics)
        self.usage = usage  # per-tenant usage records for billing (None: usage.enabled off)
        self.autoscaler = autoscaler  # counts admitted and served requests per pool

    @admission
    async def admit(self, request: web.Request, route: str, arrival: float) -> Admitted:
        """The parsed request, its raw body and the headers read of it, admitted; or a
        Rejection (written to the decision log under the request's id). Once admitted,
        `end()` must follow however the request ends. `arrival` starts its TTFT clock."""
        request_id = own_id(request)
        sampled = self.decisions.wants_next()  # one draw per request
        info: RequestInfo | None = None
        tenant: str | None = None
        try:
            headers, key, raw = await self._read(request)
            tenant = key.tenant
            body = await self._conversation(request, route, key, raw)
            prepaid = body is not None  # its per-minute request taken before the read
            content_type = request.headers.get("Content-Type")
            parsed = self._parse(headers, route, raw, request_id, content_type, body)
            parsed.edited = body is not None
            info = parsed.info
            request[MODEL_ASKED] = info.model  # as asked: aliases are resolved next
            claimed(request, parsed, key)
            name = self._route_model(info, headers, key)
            info.slo = self.slo.resolve(key, headers, self.model_slo.get(name))
            info.arrived_at = arrival
            self._check_model(info)
            charged = parsed.api is None or parsed.api.charges  # a tokenizer lookup is free
            tokens = self.token_charge(key, parsed) if charged else None
            explicit = PRIORITY_HEADER in headers
            life = await self._let_in(
                key, info, tokens, parsed.deadline_s, explicit, request=not prepaid
            )
            named(request, life)
            if self.autoscaler is not None:
                self.autoscaler.arrived(info.model)
        except Rejection as rejection:
            status, code, why = rejection.status, rejection.code, rejection.message
            if code == "no_backend" and info is not None:
                why = self._why_none(info)  # for operators, not for the client
            self.decisions.refused(
                request_id, status, code, why, info, emit=sampled,
                who={"tenant": tenant, "client_request_id": request.get(CLIENT_REQUEST_ID)},
            )  # fmt: skip
            raise
        life.sampled = sampled
        if parsed.audio_s is not None:  # audio is metered in seconds
            metrics = self.tenants.metrics
            metrics.audio_seconds.labels(metrics.tenant_label(key.tenant)).inc(parsed.audio_s)
        return Admitted(parsed, raw, headers, key, tokens or 0, life)

    async def _conversation(
        self, request: web.Request, route: str, key: KeyPolicy, raw: bytes
    ) -> dict | None:
        """A Responses request's body with its stored conversation expanded; None on other
        routes. Before the (Redis) read of up to `max_entry_bytes`, what needs only the
        client's body: router-only fields, the model named against the key's list, the
        key's in-flight cap (checked; the slot is taken at `_let_in`) and its per-minute
        request (taken)."""
        if route != RESPONSES or self.responses is None:
            return None
        body = self._json(raw)
        router_only(body, key)
        model = body.get("model")
        if isinstance(model, str) and not self.routes.may_serve(key.models, model):
            raise model_not_allowed(model)
        await self.tenants.precharge(key)
        await self.responses.expand(request, key, body)
        return body

    async def _read(self, request: web.Request) -> tuple[Mapping[str, str], KeyPolicy, bytes]:
        """The headers (their one reading), the residency decision checked, the caller's key
        and the body within its limits; or a Rejection."""
        headers = interpreted(request.headers.items())
        if self.residency.checks:
            await self.residency.check(headers)
        key = self.tenants.identify(headers)
        return headers, key, await read_body(request, self.config.limits)

    def _route_model(self, info: RequestInfo, headers: Mapping[str, str], key: KeyPolicy) -> str:
        """Aliases, the split's version and the fallbacks (unless the client forbids them
        with `x-gpuroute-fallback: none`, or the key may not use them) decided for the
        request; returns the model's name after aliases (what its SLO class and metrics go
        by). A model the key may not use is refused (403)."""
        wanted = headers.get(FALLBACK_HEADER, "auto").strip().lower()
        if wanted not in ("auto", "none"):
            raise Rejection(
                400, f"{FALLBACK_HEADER} must be `auto` or `none`", param=FALLBACK_HEADER
            )
        sticky = info.session_id or str(info.request_id)
        choice = self.routes.resolve(info.model, sticky, fallback=wanted == "auto")
        if not self.routes.permits(key.models, choice.model):
            raise model_not_allowed(info.model)
        fallbacks = tuple(m for m in choice.fallbacks if self.routes.permits(key.models, m))
        info.requested, info.model, info.fallbacks = info.model, choice.model, fallbacks
        # a LoRA adapter (vLLM serves it under its own name; the agent, or the config, says
        # which names are adapters): kept on few engines (policies/adapter_affinity.py)
        if self.backends.is_adapter(info.model):
            info.adapter = info.model
        return choice.name

    def _check_model(self, info: RequestInfo) -> None:
        models = info.models
        if not any(self.backends.serves(m) for m in models):
            message = f"The model `{clip(info.requested)}` does not exist."
            raise Rejection(404, message, param="model", code="model_not_found")
        if not any(self.backends.routable(m) or self._warm(m) for m in models):
            raise Rejection(503, NO_BACKEND, code="no_backend")

    def _warm(self, model: str) -> bool:
        """Whether a standby backend serves `model` (the attempts loop brings it in)."""
        return self.autoscaler is not None and bool(self.autoscaler.standby.waiting(model))

    def _why_none(self, info: RequestInfo) -> str:
        """Each backend serving the models and the state that keeps it from routing."""
        models = set(info.models)
        states = (f"{b.backend_id}: {b.condition}" for b in self.backends if models & b.models)
        return "no backend is routable: " + "; ".join(states)

    async def admit_other(self, request: web.Request) -> Admitted:
        """An allow-listed passthrough request: key, body, quota and queue as above (its
        tokens estimated from the body's size, since its shape is not ours to parse). A key
        limited to some models is refused (403): the path goes to a backend of any model."""
        request_id = own_id(request)
        headers, key, raw = await self._read(request)
        if key.models is not None:  # the path reaches engines of any model: no way to hold it
            listed = ", ".join(f"`{clip(m)}`" for m in sorted(key.models))
            raise Rejection(
                403,
                "passthrough paths reach engines of every model; this key is limited to "
                f"models {listed}",
                code="model_not_allowed",
            )
        priority = self.config.admission.default_priority
        info = RequestInfo(request_id, "", max(1, len(raw) // 4), priority=priority)
        info.tenant, info.client_request_id = key.tenant, request.get(CLIENT_REQUEST_ID)
        tokens = info.prompt_tokens
        life = await self._let_in(key, info, tokens, None, False)
        named(request, life)
        return Admitted(ParsedRequest(info, False, None), raw, headers, key, tokens, life)

    def token_charge(self, key: KeyPolicy, parsed: ParsedRequest) -> int:
        """What a request is charged at admission: its prompt, and each answer it asks for
        at its `max_tokens`, or at `auth.default_max_tokens` without one (then never more
        than the key's whole per-minute allowance, so that one request can always pass a
        full bucket). The end settles it against what the engine reports it used."""
        info = parsed.info
        if info.max_tokens is not None:
            return info.prompt_tokens + parsed.outputs * info.max_tokens
        charge = info.prompt_tokens + parsed.outputs * self.config.auth.default_max_tokens
        if key.tokens_per_minute is not None:
            floor = info.prompt_tokens + parsed.outputs
            charge = min(charge, max(floor, int(key.tokens_per_minute)))
        return charge

    def client(self, headers: Mapping[str, str], peer: str | None) -> str | None:
        """Who sent the request: the peer, or behind `trusted_proxies` the address their
        X-Forwarded-For names (the same walk as the global tier's)."""
        return self.proxies.client_address(peer, headers.get(FORWARDED_FOR))

    async def _let_in(
        self,
        key: KeyPolicy,
        info: RequestInfo,
        tokens: int | None,
        deadline_s: float | None,
        explicit: bool,
        *,
        request: bool = True,
    ) -> RequestLifetime:
        """The request's lifetime opened, its tenant charged (one request, unless `request`
        is False: taken before; and `tokens`, none on a free route: every per-key limit
        but the token quota still applies) and an admission slot taken; or the lifetime
        closed again and the Rejection (or cancellation) raised."""
        try:
            life = self.lifetimes.open(info)
        except LifetimeError:  # a client's id that a request in flight here carries already
            info.request_id = f"{info.request_id}.{new_request_id()}"
            life = self.lifetimes.open(info)
        charged = False
        try:
            await self.tenants.charge(key, life, tokens, explicit, request=request)
            charged = True
            await self.gate.admit(life, deadline_s)
        except BaseException as exc:  # refused, shed, or the client left: nothing ran
            if charged and tokens:
                self.tenants.settle(key, -tokens)
            self.close(life, ending_of(exc))
            raise
        life.move(Event.ADMIT)
        return life

    def close(self, life: RequestLifetime, ending: Event) -> None:
        """The one way a request ends: its lifetime closes (the core's bookings released)
        and what the shells held for it comes back (its tenant's slot, its admission slot,
        which lets the next queued request in)."""
        released = self.lifetimes.close(life, ending)
        self.tenants.give_back(released.tenant)
        if released.admitted:
            self.gate.pump()
        if released.freed:
            self.offer_room()

    def end(self, admitted: Admitted, ending: Event, answer: Answer | None) -> None:
        """An admitted request ended (`close`), and its token charge is settled against
        what its answer used (no answer relayed: nothing; an answer that cannot tell: the
        charge stands)."""
        self.close(admitted.life, ending)
        key, api = admitted.key, admitted.parsed.api
        if answer is not None:  # what the engine reported, counted as it said
            model, (prompt, completion) = admitted.life.model, answer.usage()
            if prompt is not None or completion is not None:
                self.token_counter.count(model, key.tenant, prompt or 0, completion or 0)
            if self.usage is not None:  # billing's record: the tenant's real name
                failed = answer.status >= 400
                self.usage.record(key.tenant, model, prompt or 0, completion or 0, failed)
            if self.autoscaler is not None and ending is Event.FINISH and answer.status < 400:
                asked = admitted.parsed.info.prompt_tokens if prompt is None else prompt
                self.autoscaler.served(model, asked, answer.output_tokens())  # its mean request
        if key.tokens_per_minute is None or (api is not None and not api.charges):
            return  # no token quota to settle (its usage, read above, is counted)
        used = 0 if answer is None else self._used(admitted, answer)
        if used is not None:
            self.tenants.settle(key, used - admitted.charged_tokens)

    @staticmethod
    def _used(admitted: Admitted, answer: Answer) -> int | None:
        """Tokens the request used, as its engine reports them; an audio upload's, priced
        as its charge was, from the seconds the engine transcribed (the container's header,
        which the charge came from, is the client's word)."""
        parsed = admitted.parsed
        if parsed.audio_s is not None and (seconds := answer.audio_seconds()) is not None:
            return audio_charge(seconds)
        return answer.used_tokens(parsed.info.prompt_tokens)

    @staticmethod
    def _json(raw: bytes) -> dict:
        try:
            return json_object(raw)
        except RequestError as exc:
            raise Rejection(exc.status, exc.message, param=exc.param, code=exc.code) from None

    def _parse(
        self,
        headers: Mapping[str, str],
        route: str,
        raw: bytes,
        request_id: str,
        content_type: str | None,
        body: dict | None = None,
    ) -> ParsedRequest:
        admission = self.config.admission
        try:
            return parse_request(
                route,
                raw,
                headers,
                request_id,
                priorities=tuple(admission.priorities),
                default_priority=admission.default_priority,
                with_prefix_blocks=self.with_prefix_blocks,
                longest_deadline_s=admission.default_timeout_s,
                content_type=content_type,
                body=body,
            )
        except RequestError as exc:
            raise Rejection(exc.status, exc.message, param=exc.param, code=exc.code) from None


def claimed(request: web.Request, parsed: ParsedRequest, key: KeyPolicy) -> None:
    """The request's tenant and its client's id named (in its every event); a body field
    (or an audio upload's form field) only the router may set (router/config/body_fields.py)
    refused (400, naming it) unless the key may send it."""
    parsed.info.tenant = key.tenant
    parsed.info.client_request_id = request.get(CLIENT_REQUEST_ID)
    router_only(parsed.body if parsed.form is None else parsed.form, key)


def router_only(body: Mapping[str, object] | None, key: KeyPolicy) -> None:
    """A body field only the router may set (router/config/body_fields.py) refused (400, naming
    it) unless the key may send it."""
    try:
        check_fields(body, key.allow_body_fields)
    except RouterOnlyField as exc:
        raise Rejection(400, str(exc), param=exc.field, code="router_only_field") from None


def model_not_allowed(model: str) -> Rejection:
    """A model the key may not use, as named (403)."""
    message = f"this key may not use the model `{clip(model)}`"
    return Rejection(403, message, param="model", code="model_not_allowed")


def ending_of(exc: BaseException) -> Event:
    """How a request that did not get in ended: its client left, or it was refused."""
    return Event.CANCEL if isinstance(exc, asyncio.CancelledError) else Event.REFUSE
