"""What a request's body says about its size, read the same way by router and fake engine.

No tokenizer is loaded (the router must not depend on the model's vocabulary): a token is
taken as 4 characters, OpenAI's rule of thumb for English. The fake engine counts with the
same rule, so a replayed trace's token counts survive the trip through the router.

Prefix blocks are chained hashes of consecutive 512-token (2048-character) slices, so equal
leading hashes mean an equal prefix, as in vLLM's block hashing."""

from __future__ import annotations

import hashlib
from typing import Any

from gpuroute.prefix_blocks import BLOCK_TOKENS

CHARS_PER_TOKEN = 4
BLOCK_CHARS = BLOCK_TOKENS * CHARS_PER_TOKEN


def estimate_tokens(text: str) -> int:
    return max(1, -(-len(text) // CHARS_PER_TOKEN))


def prompt_text(body: dict[str, Any]) -> str:
    """The text the engine would prefill: chat messages joined, or the completion prompt."""
    messages = body.get("messages")
    if isinstance(messages, list):
        parts = []
        for message in messages:
            if not isinstance(message, dict):
                continue
            content = message.get("content")
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):  # content parts: keep the text ones
                parts.extend(
                    p["text"]
                    for p in content
                    if isinstance(p, dict) and isinstance(p.get("text"), str)
                )
        return "\n".join(parts)
    for key in ("prompt", "input"):
        value = body.get(key)
        if isinstance(value, str):
            return value
        if isinstance(value, list):
            return "\n".join(v for v in value if isinstance(v, str))
    return ""


def prefix_blocks(text: str, limit: int = 256) -> tuple[int, ...]:
    """Chained 64-bit hashes of the prompt's full 2048-character blocks (at most `limit`)."""
    blocks = []
    parent = b""
    for start in range(0, min(len(text), limit * BLOCK_CHARS) - BLOCK_CHARS + 1, BLOCK_CHARS):
        digest = hashlib.blake2b(
            parent + text[start : start + BLOCK_CHARS].encode("utf-8", "surrogatepass"),
            digest_size=8,
        ).digest()
        blocks.append(int.from_bytes(digest, "big"))
        parent = digest
    return tuple(blocks)
