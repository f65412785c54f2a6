"""Every API the router serves, as one table: the route, whose error format it answers in,
what kind of work it asks of an engine, and how its JSON body is read (router/api_bodies.py,
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

OPENAI, ANTHROPIC = "openai", "anthropic"
GENERATE, PREFILL, AUDIO, FREE = "generate", "prefill", "audio", "free"


@dataclass(frozen=True, slots=True)
class Api:
    path: str
    errors: str  # OPENAI or ANTHROPIC: the format of its error bodies and stream errors
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
    """Route → its API (a fresh table: each app builds its own)."""
    table = [
        Api("/v1/chat/completions", OPENAI, GENERATE, read_chat),
        Api("/v1/completions", OPENAI, GENERATE, read_completion),
        Api("/v1/responses", OPENAI, GENERATE, read_responses),
        Api("/v1/messages", ANTHROPIC, GENERATE, read_messages),
        Api("/v1/messages/count_tokens", ANTHROPIC, FREE, read_count_tokens),
        Api("/v1/embeddings", OPENAI, PREFILL, read_pooled),
        Api("/pooling", OPENAI, PREFILL, read_pooled),
        Api("/classify", OPENAI, PREFILL, read_pooled),
        *(Api(p, OPENAI, PREFILL, read_rerank) for p in ("/v1/rerank", "/rerank", "/v2/rerank")),
        *(Api(p, OPENAI, PREFILL, read_score) for p in ("/v1/score", "/score")),
        Api("/v1/audio/transcriptions", OPENAI, AUDIO, None),
        Api("/v1/audio/translations", OPENAI, AUDIO, None),
        Api("/tokenize", OPENAI, FREE, read_tokenize),
        Api("/detokenize", OPENAI, FREE, read_detokenize),
    ]
    return {api.path: api for api in table}


APIS: Mapping[str, Api] = MappingProxyType(api_table())  # the built-in table, read-only
