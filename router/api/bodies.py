"""How the JSON bodies of the APIs the router serves are read (router/api/table.py is the table):
each is validated (BodyError: a 400 naming the field) and summarised as what the scheduler
needs. Token counts are estimates (gpuroute/prompt.py); the engine's usage settles them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuroute.prompt import estimate_tokens, prompt_text, prompt_tokens, prompts_in


class BodyError(Exception):
    """A body this API refuses (400), with the field at fault."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param = message, param


@dataclass(frozen=True, slots=True)
class BodySummary:
    """What the scheduler needs of a body: the text it prefills (for prefix hashes), its
    size in tokens, the most it may generate (0: nothing after the prefill), whether the
    answer streams, and how many answers it asks for."""

    text: str
    tokens: int
    max_tokens: int | None
    stream: bool = False
    outputs: int = 1


Reader = Callable[[dict[str, Any]], BodySummary]


# -- shared field readers -------------------------------------------------------------------
def positive_int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BodyError(f"'{key}' must be a positive integer", key)
    return value


def stream_flag(body: dict[str, Any]) -> bool:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BodyError("'stream' must be a boolean", "stream")
    return stream


def required_list(body: dict[str, Any], key: str, *, of: type | tuple[type, ...]) -> list:
    value = body.get(key)
    if not isinstance(value, list) or not value:
        raise BodyError(f"'{key}' is required and must be a non-empty list", key)
    if not all(isinstance(v, of) for v in value):
        raise BodyError(f"'{key}' has an item of the wrong type", key)
    return value


def required_input(body: dict[str, Any], key: str) -> None:
    """A prompt field: a string, or a non-empty list (of strings or token ids)."""
    value = body.get(key)
    if not isinstance(value, str | list) or (isinstance(value, list) and not value):
        raise BodyError(f"'{key}' is required and must not be empty", key)


def text_or_texts(body: dict[str, Any], key: str) -> list[str]:
    """A field holding a string or a non-empty list of strings."""
    value = body.get(key)
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return value
    raise BodyError(f"'{key}' is required: a string or a list of strings", key)


def _summary(body: dict[str, Any], max_tokens: int | None, outputs: int = 1) -> BodySummary:
    return BodySummary(
        prompt_text(body), prompt_tokens(body), max_tokens, stream_flag(body), outputs
    )


# -- OpenAI's completions family ----------------------------------------------------------
def read_chat(body: dict[str, Any]) -> BodySummary:
    required_list(body, "messages", of=dict)
    return _summary(body, _output_cap(body), _choices(body))


def read_completion(body: dict[str, Any]) -> BodySummary:
    required_input(body, "prompt")
    return _summary(body, _output_cap(body), _choices(body) * prompts_in(body))


def read_pooled(body: dict[str, Any]) -> BodySummary:
    """embeddings, pooling, classify: an `input` to prefill, no text answer."""
    required_input(body, "input")
    return BodySummary(prompt_text(body), prompt_tokens(body), 0, False, 0)


def _output_cap(body: dict[str, Any]) -> int | None:
    return positive_int(body, "max_completion_tokens") or positive_int(body, "max_tokens")


def _choices(body: dict[str, Any]) -> int:
    return max(positive_int(body, "n") or 1, positive_int(body, "best_of") or 1)


# -- rerank and score: prefill only, every (query, document) pair ------------------------
def _document_text(document: Any) -> str:
    """A document as text: a string, `{"text": ...}` (Jina's, Cohere's), or vLLM's
    `{"content": [parts]}` (what the engine accepts is the engine's to say)."""
    if isinstance(document, str):
        return document
    if isinstance(document, dict):
        if isinstance(document.get("text"), str):
            return document["text"]
        parts = document.get("content")
        if isinstance(parts, list):
            return "\n".join(
                p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)
            )
    raise BodyError("each document must be a string or an object with text", "documents")


def read_rerank(body: dict[str, Any]) -> BodySummary:
    query = body.get("query")
    if not isinstance(query, str) or not query:
        raise BodyError("'query' is required and must be a string", "query")
    documents = [_document_text(d) for d in required_list(body, "documents", of=(str, dict))]
    positive_int(body, "top_n")
    query_tokens = estimate_tokens(query)
    tokens = sum(query_tokens + estimate_tokens(d) for d in documents)
    return BodySummary(query, tokens, 0, False, 0)


def read_score(body: dict[str, Any]) -> BodySummary:
    firsts, seconds = text_or_texts(body, "text_1"), text_or_texts(body, "text_2")
    if len(firsts) > 1 and len(seconds) != len(firsts):
        raise BodyError("'text_1' and 'text_2' must be as long as each other", "text_2")
    if len(firsts) == 1:  # one text_1 against each text_2
        firsts = firsts * len(seconds)
    pairs = zip(firsts, seconds, strict=True)
    tokens = sum(estimate_tokens(a) + estimate_tokens(b) for a, b in pairs)
    return BodySummary(firsts[0], tokens, 0, False, 0)


# -- tokenizer lookups ----------------------------------------------------------------------
def read_tokenize(body: dict[str, Any]) -> BodySummary:
    if not isinstance(body.get("prompt"), str) and not isinstance(body.get("messages"), list):
        raise BodyError("'prompt' (a string) or 'messages' is required", "prompt")
    return BodySummary("", prompt_tokens(body), 0, False, 0)


def read_detokenize(body: dict[str, Any]) -> BodySummary:
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in tokens
    ):
        raise BodyError("'tokens' is required: a list of token ids", "tokens")
    return BodySummary("", max(1, len(tokens)), 0, False, 0)
