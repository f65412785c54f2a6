"""One reading of the request headers any tier interprets, the same at every hop.

Two readers that pick different copies of a duplicated header disagree about who a client
is: the global tier once read the first of two `Authorization` lines (an unknown key, so no
residency rule) while the router read the last (an EU-only key), and the request was served
in us-east. So before anyone reads them:

- a single-valued header that a tier interprets (`Authorization`, the session ids, every
  `x-gpuroute-*`) sent more than once, in any spelling of its name, is refused with 400;
- a list-valued one (`X-Forwarded-For`) has its lines joined in order with ", "
  (RFC 9110 §5.3), so a proxy's own line is read with the client's.

Tiers read only what `interpreted` returns, and pass on to the next hop only the
allow-listed headers `pass_on` keeps, never the caller's copies of the ones they compose."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gpuroute.openai_api import Rejection, clip

PREFIX = "x-gpuroute-"
SINGLE_VALUED = frozenset({"authorization", "x-api-key", "x-session-id"})
LIST_VALUED = frozenset({"x-forwarded-for"})
FORWARDED_FOR = "x-forwarded-for"
FALLBACK_HEADER = "x-gpuroute-fallback"  # `none`: serve the model asked for or nothing
SERVED_MODEL_HEADER = "x-gpuroute-served-model"  # on answers: the model that served it

# What an engine needs to answer: the body's type, what the client accepts, and the trace
# context that ties its spans to ours. Never a client's key, cookies, our own control
# headers, or forwarding headers the client wrote (the router composes X-Forwarded-For).
# The trace context and X-Request-Id are never passed on as they came: each hop composes
# them from what it validated (gpuroute/tracing.py `onward`); an engine gets an id unique to
# its attempt, since some vLLM versions take it as the request's unique key.
ENGINE_HEADERS = frozenset({"content-type", "accept", "user-agent", "traceparent", "tracestate"})
# What a regional router reads of a request, besides what an engine gets.
ROUTER_HEADERS = ENGINE_HEADERS | frozenset(
    {
        "x-request-id",
        "authorization",
        "x-api-key",
        "x-session-id",
        "x-gpuroute-session",
        "x-gpuroute-priority",
        "x-gpuroute-deadline-ms",
        "x-gpuroute-slo",
        FALLBACK_HEADER,
    }
)


COMPOSED = frozenset({"traceparent", "tracestate", "x-request-id"})  # by each hop, validated
NEVER_TO_ENGINES = frozenset(
    {
        # credentials
        "authorization", "proxy-authorization", "cookie", "x-api-key",
        # framing and hop-by-hop (RFC 9110 §7.6.1): the upstream client writes its own
        "host", "content-length", "transfer-encoding", "connection", "keep-alive", "te",
        "trailer", "upgrade", "expect", "proxy-connection",
        # the body arrives decoded: a Content-Encoding would make an engine fail on it
        "content-encoding",
        # forwarding: composed by each hop, never a client's
        "forwarded", "x-forwarded-host", "x-forwarded-proto", "x-real-ip",
    }
)  # fmt: skip


def engine_header(name: str) -> str:
    """A header name an operator lets through to engines, lowercase; ValueError for one
    that must never reach them (keys, cookies, framing, forwarding, our control headers)."""
    lower = name.strip().lower()
    if not lower or not all(c.isalnum() or c in "-_" for c in lower):
        raise ValueError(f"{name!r}: not a header name")
    if lower in NEVER_TO_ENGINES or lower in LIST_VALUED or lower.startswith(PREFIX):
        raise ValueError(f"{name!r}: never passed on to engines")
    return lower


def interpreted(items: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The headers a tier may read, by lowercase name; Rejection (400) for a duplicated
    single-valued one."""
    out: dict[str, str] = {}
    for name, value in items:
        lower = name.lower()
        if lower in LIST_VALUED:
            out[lower] = f"{out[lower]}, {value}" if lower in out else value
        elif lower in SINGLE_VALUED or lower.startswith(PREFIX):
            if lower in out:
                raise Rejection(
                    400,
                    f"header {clip(lower, 60)} sent more than once; send it once",
                    code="duplicate_header",
                    param=clip(lower, 60),
                )
            out[lower] = value
    return out


def pass_on(items: Iterable[tuple[str, str]], allowed: frozenset[str]) -> dict[str, str]:
    """The allow-listed headers for the next hop, duplicates joined (RFC 9110 §5.3), under
    their lowercase names; never the trace context or request id as they came."""
    out: dict[str, str] = {}
    for name, value in items:
        lower = name.lower()
        if lower in allowed and lower not in COMPOSED:
            out[lower] = f"{out[lower]}, {value}" if lower in out else value
    return out


def forwarded_for(read: Mapping[str, str], peer: str | None) -> str:
    """X-Forwarded-For for the next hop: what arrived (all lines, joined) with the peer
    that sent it appended, as every proxy in the chain does."""
    before = read.get(FORWARDED_FOR)
    peer = peer or "unknown"
    return f"{before}, {peer}" if before else peer


def router_headers(
    items: Iterable[tuple[str, str]], read: Mapping[str, str], peer: str | None
) -> dict[str, str]:
    """What a region's router gets of a request's headers (before the decision): the ones
    it reads, and X-Forwarded-For with the client appended."""
    headers = pass_on(items, ROUTER_HEADERS)
    headers[FORWARDED_FOR] = forwarded_for(read, peer)
    return headers
