"""The router's access-log line (gpuroute/access_log.py): what the proxy knew of a request
when it answered, gathered here so that the proxy's hook stays one call."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from gpuroute.router.api.request_ids import CLIENT_REQUEST_ID
from gpuroute.router.attempts.exchange import Answer, Exchange

from gpuroute.access_log import AccessLog, AccessLogConfig, ms
from gpuroute.tracing import REQUEST_ID

# the request as it ended (the proxy leaves it there), for its access line
ENDED = web.RequestKey("gpuroute.access_ended", Exchange)


def forget_exchange(request: web.Request) -> None:
    """Once its line and counts are written: the exchange holds the request, so one left
    on it makes every request a reference cycle that only the collector frees (a gen-1
    collection every 20 or so requests under load, and gen-2 pauses in the p99)."""
    request.pop(ENDED, None)


# the caller's tenant on a route the router answers itself (a stored response by id)
TENANT = web.RequestKey("gpuroute.access_tenant", str)


class RouterAccessLog:
    def __init__(self, config: AccessLogConfig, log: AccessLog | None = None) -> None:
        self.log = log if log is not None else AccessLog(config)

    def answered(self, request: web.Request, route: str, status: int, elapsed: float) -> None:
        """One line for an answered request, if the sample takes it."""
        rate = self.log.sample()
        if rate is not None:
            self.log.write(fields(request, route, status, elapsed, rate))


def fields(
    request: web.Request, route: str, status: int, elapsed: float, rate: float
) -> dict[str, Any]:
    """The line's fields: those a request refused at the front never had stay None."""
    out: dict[str, Any] = {
        "request_id": request.get(REQUEST_ID),  # the router's own, unique
        "client_request_id": request.get(CLIENT_REQUEST_ID),  # the client's x-request-id
        "method": request.method,
        "route": route,
        "status": status,
        "tenant": request.get(TENANT),
        "model": None,
        "served_model": None,
        "backend": None,
        "prompt_tokens": None,
        "completion_tokens": None,
        "ttft_ms": None,
        "duration_ms": ms(elapsed),
        "sample_rate": rate,
    }
    exchange = request.get(ENDED)
    if exchange is not None:
        out.update(admitted_fields(exchange))
        first = exchange.first_token_at or exchange.first_at
        if first is not None:  # the first token (a stream whose text is unseen: first byte)
            out["ttft_ms"] = ms(first - exchange.arrival)
        if exchange.answer is not None:
            out.update(answer_fields(exchange.answer))
    return out


def admitted_fields(admitted: Exchange) -> dict[str, Any]:
    info = admitted.parsed.info
    return {
        "tenant": admitted.key.tenant,
        "model": info.requested or None,  # none: a passthrough path
        "served_model": admitted.life.model or None,
        "prompt_tokens": info.prompt_tokens,  # the router's estimate until usage says
    }


def answer_fields(answer: Answer) -> dict[str, Any]:
    """Tokens as the engine's usage reports them (prompt: the estimate without one;
    completion: a stream's estimate without one), and the backend that answered."""
    out: dict[str, Any] = {"backend": answer.backend}
    prompt, completion = answer.usage()
    if prompt is not None:
        out["prompt_tokens"] = prompt
    out["completion_tokens"] = completion if completion is not None else answer.output_tokens()
    return out
