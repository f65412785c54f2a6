"""Every API the router serves, as one table: the route, what kind of work it asks of an
engine, and how its JSON body is read (router/api/bodies.py,
router/api/formats.py).

The kind of work decides how a request is priced and admitted:
- `generate`: prefill, then tokens until `max_tokens` (chat, completions, responses, messages);
- `prefill`: the prompt and nothing after it, priced by every document's tokens (embeddings,
  rerank, score, pooling, classify);
- `audio`: a multipart upload priced by the audio's duration (transcriptions, translations);
- `free`: cheap lookups (tokenize, detokenize, count_tokens): routed to a backend of the
  model, never held for an SLO and never charged tokens; every other per-key limit
  (requests per minute, in-flight cap, class cap, body size) applies as on any route.

`route_limits()` says which per-key limits each public route applies, this table's routes
and the others alike; docs/security.md ("Limits on every route") and
tests/security/test_route_limits.py are both checked against it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from gpuroute.router.api.bodies import (
    Reader,
    read_chat,
    read_completion,
    read_detokenize,
    read_pooled,
    read_rerank,
    read_score,
    read_tokenize,
)
from gpuroute.router.api.formats import read_count_tokens, read_messages, read_responses

GENERATE, PREFILL, AUDIO, FREE = "generate", "prefill", "audio", "free"


@dataclass(frozen=True, slots=True)
class Api:
    path: str
    work: str  # GENERATE, PREFILL, AUDIO or FREE
    read: Reader | None  # None: not a JSON body (audio's multipart)

    @property
    def holds(self) -> bool:
        """May wait for a backend predicted to meet its SLO (a free lookup never waits)."""
        return self.work != FREE

    @property
    def charges(self) -> bool:
        """Charged tokens against the tenant's token quota (every route counts a request)."""
        return self.work != FREE


def api_table() -> dict[str, Api]:
    """Route → its API. Which routes answer in Anthropic's error format is
    gpuroute/anthropic_errors.py's ANTHROPIC_ROUTES (both tiers need it)."""
    table = [
        Api("/v1/chat/completions", GENERATE, read_chat),
        Api("/v1/completions", GENERATE, read_completion),
        Api("/v1/responses", GENERATE, read_responses),
        Api("/v1/messages", GENERATE, read_messages),
        Api("/v1/messages/count_tokens", FREE, read_count_tokens),
        Api("/v1/embeddings", PREFILL, read_pooled),
        Api("/pooling", PREFILL, read_pooled),
        Api("/classify", PREFILL, read_pooled),
        *(Api(p, PREFILL, read_rerank) for p in ("/v1/rerank", "/rerank", "/v2/rerank")),
        *(Api(p, PREFILL, read_score) for p in ("/v1/score", "/score")),
        Api("/v1/audio/transcriptions", AUDIO, None),
        Api("/v1/audio/translations", AUDIO, None),
        Api("/tokenize", FREE, read_tokenize),
        Api("/detokenize", FREE, read_detokenize),
    ]
    return {api.path: api for api in table}


APIS: Mapping[str, Api] = MappingProxyType(api_table())  # the built-in table, read-only


@dataclass(frozen=True, slots=True)
class RouteLimits:
    """The per-key limits one public route applies. Every route takes one request from the
    key's `requests_per_minute` and holds one of its `max_in_flight` slots while it runs;
    the rest depend on what the route does."""

    method: str  # `*`: any (a passthrough path)
    path: str
    tokens: bool  # charged against `tokens_per_minute` (an estimate, settled on usage)
    body: bool  # a body is read: `limits.max_body_bytes` (413 beyond it)
    queued: bool  # waits in the admission queue at the key's class (a higher one is capped)


PASSTHROUGH = "(each of `passthrough_paths`)"
RESPONSE_BY_ID = "/v1/responses/{response_id}"


def route_limits(apis: Mapping[str, Api] = APIS) -> list[RouteLimits]:
    """Every public route the router serves, with its limits: the APIs, then what the
    router answers itself (the model list; stored responses, with `responses.enabled`),
    then the allow-listed passthrough paths."""
    rows = [RouteLimits("POST", api.path, api.charges, True, True) for api in apis.values()]
    rows += [
        RouteLimits("GET", "/v1/models", False, False, False),
        RouteLimits("GET", RESPONSE_BY_ID, False, False, False),
        RouteLimits("DELETE", RESPONSE_BY_ID, False, False, False),
        RouteLimits("POST", RESPONSE_BY_ID + "/cancel", False, False, False),
        RouteLimits("*", PASSTHROUGH, True, True, True),  # tokens: the body's size / 4
    ]
    return rows


def limits_row(row: RouteLimits) -> str:
    """`row` as docs/security.md's table writes it."""
    tokens = "charged" if row.tokens else "not charged"
    body = "`max_body_bytes`" if row.body else "no body read"
    cls = "capped at the key's" if row.queued else "not queued"
    return f"| {row.method} {row.path} | 1 | 1 slot | {tokens} | {body} | {cls} |"
