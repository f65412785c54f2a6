"""The decision log: why each request went where it went, or was refused.

Every decision, hold, refusal and failed attempt of the last `keep` events is kept in memory
(`explain(request_id)`: the admin endpoint `/admin/explain/{id}` and `gpuroute explain`), so
an operator can ask about a request without having turned anything on; a sampled share of
them (every event of a sampled request) is also written on `gpuroute.decisions`, the
event the record's `decision` field. Sampling draws once per request from its own RNG
(turning it on must not change which backends are picked). A decision holds each stage of
the pick as it ran before the booking (`PickTrace`): which backends were no candidates and
why, which the filter dropped and why, each candidate's prediction and score terms, the
margin the chosen one needed, and the pick's reason."""

from __future__ import annotations

import collections
import logging
import random
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from gpuroute.router.core.backend import Backend
from gpuroute.router.core.policies.base import PickTrace
from gpuroute.router.core.request import RequestInfo
from gpuroute.router.core.scheduler import Decision
from gpuroute.router.observe.tracing_spans import annotate, current_span

from gpuroute.logs import log_entry

decisions = logging.getLogger("gpuroute.decisions")
Event = dict[str, Any]


class DecisionLog:
    def __init__(
        self,
        sample: float,
        policy: str,
        *,
        keep: int = 2000,
        rng: random.Random | None = None,
        emit: Callable[[Event], None] | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.sample, self.policy = sample, policy
        self.rng = rng or random.Random()
        self.emit = emit if emit is not None else self.log
        self.wall_clock = wall_clock
        self.recent: collections.deque[Event] = collections.deque(maxlen=keep)

    @staticmethod
    def log(event: Event) -> None:
        """An event on `gpuroute.decisions`: its kind the message, the event the `decision`
        field (an object in a JSON line, not a JSON string in the message)."""
        log_entry(decisions, str(event.get("event", "decision")), event, "decision")

    @property
    def keeps(self) -> bool:
        """Recent events are kept for `explain` (decision_log_keep > 0)."""
        return bool(self.recent.maxlen)

    def trace(self, sampled: bool = False) -> PickTrace | None:
        """A trace for the next pick: while recent decisions are kept, or for a sampled
        request (whose trace is full: every candidate's score, every exclusion)."""
        return PickTrace(full=sampled) if self.keeps or sampled else None

    def wants_next(self) -> bool:
        """Are the next request's events to be written out? Drawn once per request, from
        the log's own RNG."""
        return bool(self.sample) and self.rng.random() < self.sample

    def decision(self, info: RequestInfo, decision: Decision, attempt: int, *, emit: bool) -> None:
        if emit or current_span() is not None:
            self._record(info.request_id, decision_event(info.model, decision, attempt), info, emit)
        elif self.keeps:  # kept for `explain` alone (most requests): its event made if asked
            self.recent.append(
                Kept(
                    self.wall_clock(), info.request_id, self.policy, about(info), decision, attempt
                )
            )

    def held(self, info: RequestInfo, *, emit: bool) -> None:
        event = {"event": "held", "why": "no backend is predicted to meet its SLO"}
        self._record(info.request_id, event, info, emit)

    def no_backend(self, info: RequestInfo, trace: PickTrace | None, *, emit: bool) -> None:
        """No candidate was left for an attempt: each backend serving the model, and why."""
        excluded = dict(trace.excluded) if trace is not None else {}
        event = {"event": "no_candidate", "excluded": excluded}
        self._record(info.request_id, event, info, emit)

    def refused(
        self,
        request_id: object,
        status: int,
        code: str | None,
        why: str,
        info: RequestInfo | None = None,
        *,
        emit: bool,
        who: Event | None = None,
    ) -> None:
        """An answer other than the engine's: a refusal (4xx), no backend (503), all
        attempts failed (502). `who`: its tenant and client's id, where no `info` says them
        (refused before its body was read)."""
        event = {"event": "refused", "status": status, "code": code, "why": why}
        self._record(request_id, event, info, emit, who)

    def failure(self, info: RequestInfo, backend: Backend, kind: str, *, emit: bool) -> None:
        event = {"event": "attempt_failed", "backend": backend.backend_id, "kind": kind}
        self._record(info.request_id, event, info, emit)

    def explain(self, request_id: str) -> list[Event]:
        """What is kept of one request (by the router's id), or of every request that came
        with a client's id (each event names its request and tenant), oldest first ([] when
        none is among the recent)."""
        found = []
        for e in self.recent:
            ids = (e.request_id, e.about[1]) if isinstance(e, Kept) else (
                e["request_id"], e.get("client_request_id"))  # fmt: skip
            if str(ids[0]) == request_id or ids[1] == request_id:
                found.append(e.event() if isinstance(e, Kept) else e)
        return found

    def _record(
        self,
        request_id: object,
        event: Event,
        info: RequestInfo | None,
        emit: bool,
        who: Event | None = None,
    ) -> None:
        head = heading(self.wall_clock(), request_id, self.policy, who or {})
        if info is not None:
            head |= described(about(info))
        event = head | event
        annotate(event)  # on the request's current span, where tracing records
        if self.keeps:
            self.recent.append(event)
        if emit:
            self.emit(event)


# what an event says of its request: tenant, client's id, model, as asked, prompt, SLO class
About = tuple[str | None, str | None, str, str, int, str | None]


def about(info: RequestInfo) -> About:
    """The request's fields an event names, as they are now."""
    slo = info.slo.name if info.slo is not None else None
    return (info.tenant, info.client_request_id, info.model, info.requested,
            info.prompt_tokens, slo)  # fmt: skip


def heading(ts: float, request_id: object, policy: str, who: Event) -> Event:
    """Every event's first fields (`who`: its tenant and client's id, where no request's
    fields say them)."""
    head: Event = {"ts": ts, "request_id": request_id, "policy": policy}
    head["tenant"] = who.get("tenant")
    if (client_id := who.get("client_request_id")) is not None:
        head["client_request_id"] = client_id
    return head


def described(fields: About) -> Event:
    """An event's fields of its request (`about`)."""
    tenant, client_id, model, requested, prompt_tokens, slo = fields
    out: Event = {"tenant": tenant}
    if client_id is not None:
        out["client_request_id"] = client_id
    out["model"] = model
    if requested != model:
        out["requested_model"] = requested
    out |= {"prompt_tokens": prompt_tokens, "slo_class": slo}
    return out


def decision_event(model: str, decision: Decision, attempt: int) -> Event:
    """A decision's own fields (`model`: the request's, where the decision names none)."""
    event: Event = {
        "event": "decision",
        "attempt": attempt,
        "reason": decision.reason.value,
        "chosen": decision.backend.backend_id,
        "chosen_gpu": decision.backend.gpu_type,
        "served_model": decision.model or model,
        "fits_slo": decision.fits,
        "booked": decision.booked,
    }
    if decision.prediction is not None:
        event["predicted_ttft_s"] = round(decision.prediction.ttft_s, 4)
        event["predicted_tpot_s"] = round(decision.prediction.tpot_s, 5)
    if decision.trace is not None:
        event |= stages(decision.trace)
    return event


class Kept(NamedTuple):
    """A decision kept for `explain` only, with what its event needs as it stood then (a
    pick's trace is written during the pick alone): the event is made when asked for."""

    ts: float
    request_id: object
    policy: str
    about: About
    decision: Decision
    attempt: int

    def event(self) -> Event:
        head = heading(self.ts, self.request_id, self.policy, {}) | described(self.about)
        return head | decision_event(self.about[2], self.decision, self.attempt)


def stages(trace: PickTrace) -> Event:
    """The trace as the log shows it: candidates and exclusions, each considered backend's
    row (prediction, filter verdict, score or score terms), the margin needed."""
    out: Event = {"candidates_n": trace.candidates, "excluded": dict(trace.excluded)}
    if trace.sampled is not None:
        out["sampled"] = trace.sampled
    out["candidates"] = [{"backend": b} | row for b, row in trace.rows.items()]
    if trace.margin is not None:
        out["margin_needed"] = trace.margin
    if trace.fallback is not None:
        out["fallback_model"] = trace.fallback
    return out
