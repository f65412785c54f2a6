"""Response bodies of the fake engine, shaped like vLLM's OpenAI server output."""

from __future__ import annotations

import hashlib
import struct
from typing import Any

TOKEN_TEXT = " tok"  # four characters: one token by the 4-characters rule (gpuroute.prompt)


def tokens_text(n: int) -> str:
    return TOKEN_TEXT * n


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _envelope(
    rid: str, obj: str, created: int, model: str, choices: list, **extra: Any
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": obj,
        "created": created,
        "model": model,
        "choices": choices,
    } | extra


def chat_chunk(
    rid: str, created: int, model: str, delta: dict[str, Any], finish: str | None = None
) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return _envelope(rid, "chat.completion.chunk", created, model, [choice])


def completion_chunk(
    rid: str, created: int, model: str, text: str, finish: str | None = None
) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return _envelope(rid, "text_completion", created, model, [choice])


SYSTEM_FINGERPRINT = "gpuroute-fake-engine"  # vLLM: "vllm-<version>-<hash>"


def usage_chunk(
    kind: str, rid: str, created: int, model: str, prompt: int, completion: int
) -> dict[str, Any]:
    chunk = _envelope(rid, kind, created, model, [], usage=usage(prompt, completion))
    return chunk | {"system_fingerprint": SYSTEM_FINGERPRINT}


def chat_completion(
    rid: str, created: int, model: str, output: int, prompt: int, finish: str
) -> dict[str, Any]:
    message = {"role": "assistant", "content": tokens_text(output)}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
    answer = _envelope(
        rid, "chat.completion", created, model, [choice], usage=usage(prompt, output)
    )
    return answer | {"system_fingerprint": SYSTEM_FINGERPRINT}


def completion(
    rid: str, created: int, model: str, output: int, prompt: int, finish: str
) -> dict[str, Any]:
    choice = {"index": 0, "text": tokens_text(output), "logprobs": None, "finish_reason": finish}
    answer = _envelope(
        rid, "text_completion", created, model, [choice], usage=usage(prompt, output)
    )
    return answer | {"system_fingerprint": SYSTEM_FINGERPRINT}


def embedding(text: str, dims: int = 16) -> list[float]:
    """A deterministic unit-ish vector derived from the text (same text, same vector)."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=dims * 2).digest()
    return [v / 32768.0 for v in struct.unpack(f">{dims}h", digest)]


def embeddings(model: str, texts: list[str], prompt: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": embedding(t)}
            for i, t in enumerate(texts)
        ],
        "model": model,
        "usage": {"prompt_tokens": prompt, "total_tokens": prompt},
    }


def models_list(model: str, created: int, max_model_len: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {
                "id": model,
                "object": "model",
                "created": created,
                "owned_by": "gpuroute-fake-engine",
                "root": model,
                "parent": None,
                "max_model_len": max_model_len,
            }
        ],
    }
