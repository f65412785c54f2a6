"""Every API the router serves, as one table: the route, what kind of work it asks of an
engine, and how its JSON body is read (router/api_bodies.py,
router/api_formats.py).

The kind of work decides how a request is priced and admitted:
- `generate`: prefill, then tokens until `max_tokens` (chat, completions, responses, messages);
- `prefill`: the prompt and nothing after it, priced by every document's tokens (embeddings,
  rerank, score, pooling, classify);
- `audio`: a multipart upload priced by the audio's duration (transcriptions, translations);
- `free`: cheap lookups (tokenize, detokenize, count_tokens): routed to a backend of the
  model, never held for an SLO and never counted against quotas."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from gpuroute.router.api_bodies import (
    Reader,
    read_chat,
    read_completion,
    read_detokenize,
    read_pooled,
    read_rerank,
    read_score,
    read_tokenize,
)
from gpuroute.router.api_formats import read_count_tokens, read_messages, read_responses

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
        """Counted against the tenant's quotas."""
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
