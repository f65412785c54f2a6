"""What a request's body says about its size, read the same way by router and fake engine.

No tokenizer is loaded (the router must not depend on the model's vocabulary): an ASCII
token is taken as 4 characters, OpenAI's rule of thumb for English, and every other
character as a token of its own (CJK text runs at about one token per character; counting
it at 4 per token undercounted it 4x). Token-id prompts count their ids, images a fixed
`IMAGE_TOKENS`, tool definitions and tool calls their JSON. The fake engine counts with the
same rules, so a replayed trace's token counts survive the trip through the router.

Prefix blocks are chained hashes of consecutive 512-token (2048-character) slices, so equal
leading hashes mean an equal prefix, as in vLLM's block hashing."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from gpuroute.prefix_blocks import BLOCK_TOKENS

CHARS_PER_TOKEN = 4
BLOCK_CHARS = BLOCK_TOKENS * CHARS_PER_TOKEN
IMAGE_TOKENS = 1024  # an image or audio part, whatever its size (a tile of most VLMs is less)
MEDIA_PARTS = frozenset({"image_url", "input_image", "image", "input_audio", "audio_url"})


def estimate_tokens(text: str) -> int:
    if text.isascii():
        return max(1, -(-len(text) // CHARS_PER_TOKEN))
    other = len(text) - len(text.encode("ascii", "ignore"))
    return max(1, -(-(len(text) - other) // CHARS_PER_TOKEN) + other)


def prompt_tokens(body: dict[str, Any]) -> int:
    """The prompt's size in tokens (estimated; ids counted): chat messages with their
    parts and tool calls, the tools offered, or a completion or embedding input (a string,
    strings, token ids, or lists of token ids)."""
    messages = body.get("messages")
    if isinstance(messages, list):
        total = sum(_message_tokens(m) for m in messages if isinstance(m, dict))
        tools = body.get("tools")
        if isinstance(tools, list) and tools:
            total += estimate_tokens(_json(tools))
        return max(1, total)
    for key in ("prompt", "input"):
        value = body.get(key)
        if value is not None:
            return max(1, _input_tokens(value))
    return 1


def prompts_in(body: dict[str, Any]) -> int:
    """How many prompts a completion body holds (a list of strings or of id lists is a
    batch, each answered); 1 for everything else."""
    value = body.get("prompt")
    if isinstance(value, list) and value and all(isinstance(v, str | list) for v in value):
        return len(value)
    return 1


def _message_tokens(message: dict[str, Any]) -> int:
    total = 0  # a chat template's role markers are the engine's to count (usage settles it)
    content = message.get("content")
    if isinstance(content, str):
        total += estimate_tokens(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict):
                text = part.get("text")
                if isinstance(text, str):
                    total += estimate_tokens(text)
                elif part.get("type") in MEDIA_PARTS:
                    total += IMAGE_TOKENS
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        total += estimate_tokens(_json(calls))
    return total


def _input_tokens(value: Any) -> int:
    if isinstance(value, str):
        return estimate_tokens(value)
    if not isinstance(value, list):
        return 0
    if value and all(isinstance(v, int) for v in value):
        return len(value)  # token ids
    return sum(_input_tokens(v) for v in value)


def _json(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except (TypeError, orjson.JSONEncodeError):
        return ""


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
