"""Response bodies of the fake engine, shaped like vLLM's OpenAI server output."""

from __future__ import annotations

import hashlib
import struct
from typing import Any

from gpuroute.testbed.fake_engine.tokenize import decode, encode, message_ids

from gpuroute.continuation.text import id_prompt
from gpuroute.prompt import estimate_tokens

TOKEN_TEXT = " tok"  # four characters: one token by the 4-characters rule (gpuroute.prompt)
(TOKEN_ID,) = encode(TOKEN_TEXT)  # its id, as the fake's /tokenize gives it


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
    """ChatCompletionResponse's fields in vLLM's order: usage after system_fingerprint, and
    its extras (`with_prompt_extras`) after usage."""
    message = {"role": "assistant", "content": tokens_text(output)}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
    answer = _envelope(rid, "chat.completion", created, model, [choice])
    return answer | {"system_fingerprint": SYSTEM_FINGERPRINT, "usage": usage(prompt, output)}


def completion(
    rid: str, created: int, model: str, output: int, prompt: int, finish: str
) -> dict[str, Any]:
    choice = {"index": 0, "text": tokens_text(output), "logprobs": None, "finish_reason": finish}
    answer = _envelope(rid, "text_completion", created, model, [choice])
    return answer | {"system_fingerprint": SYSTEM_FINGERPRINT, "usage": usage(prompt, output)}


def with_prompt_extras(
    answer: dict[str, Any], body: dict, prompt: int, output: int
) -> dict[str, Any]:
    """A whole answer with what vLLM adds when asked, where it puts it: `return_token_ids`
    (the answer's ids on its choice, the prompt's), `prompt_logprobs` and
    `return_prompt_text` (chat only, vLLM 0.32). A chat answer carries the prompt's on its
    top level after `usage` (ChatCompletionResponse), a completion on its choice, before
    `usage`."""
    ids = body.get("return_token_ids") is True
    wanted = body.get("prompt_logprobs")
    logprobs = isinstance(wanted, int) and not isinstance(wanted, bool) and wanted >= -1
    text = body.get("return_prompt_text") is True and "message" in answer["choices"][0]
    if not (ids or logprobs or text):
        return answer
    prompt_ids = prompt_token_ids(body, prompt)
    choice = answer["choices"][0]
    if ids:
        choice["token_ids"] = [TOKEN_ID] * output
    holder = choice if "text" in choice else answer
    if logprobs:
        holder["prompt_logprobs"] = prompt_logprobs(prompt_ids)
    if ids:
        holder["prompt_token_ids"] = prompt_ids
    if text:
        holder["prompt_text"] = decode(prompt_ids)
    return answer


def rendered_prompt(body: dict, prompt: int) -> str:
    """What vLLM's `return_prompt_text` gives: the prompt as the engine saw it."""
    return decode(prompt_token_ids(body, prompt))


def prompt_logprobs(ids: list[int]) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's prompt logprobs: none for the first token, then each token's own."""
    return [None] + [
        {str(t): {"logprob": -1.0, "rank": 1, "decoded_token": decode([t])}} for t in ids[1:]
    ]


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


# -- the Responses API (vLLM: entrypoints/openai/responses/protocol.py ResponsesResponse) ----
def responses_usage(prompt: int, output: int) -> dict[str, Any]:
    """ResponseUsage as vLLM fills it (responses/serving.py, responses_full_generator)."""
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0,
                                 "input_tokens_per_turn": [], "cached_tokens_per_turn": []},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0,
                                  "output_tokens_per_turn": [],
                                  "tool_output_tokens_per_turn": []},
        "total_tokens": prompt + output,
    }  # fmt: skip


def output_text_part(text: str, logprobs: list | None = None) -> dict[str, Any]:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}


def output_message(item_id: str, text: str | None, status: str = "completed") -> dict[str, Any]:
    """An assistant message item (`text` None: opened, no content yet)."""
    content = [] if text is None else [output_text_part(text)]
    return {"id": item_id, "content": content, "role": "assistant", "status": status,
            "type": "message", "phase": None}  # fmt: skip


def response_object(
    request: dict[str, Any], rid: str, created: int, model: str, max_output: int
) -> dict[str, Any]:
    """A response before it runs (status in_progress, no output, no usage): what
    ResponsesResponse.from_request echoes of the request, in vLLM's field order."""
    tools = request.get("tools") or []
    return {
        "id": rid, "created_at": created, "incomplete_details": None,
        "instructions": request.get("instructions"), "metadata": request.get("metadata"),
        "model": model, "object": "response", "output": [],
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "temperature": _given(request, "temperature", 1.0),
        "tool_choice": request.get("tool_choice") or ("auto" if tools else "none"),
        "tools": tools, "top_p": _given(request, "top_p", 1.0),
        "background": bool(request.get("background")), "max_output_tokens": max_output,
        "max_tool_calls": request.get("max_tool_calls"),
        "previous_response_id": request.get("previous_response_id"), "prompt": None,
        "reasoning": request.get("reasoning"),
        "service_tier": request.get("service_tier") or "auto", "status": "in_progress",
        "text": request.get("text"), "top_logprobs": None,
        "truncation": request.get("truncation") or "disabled", "usage": None,
        "user": request.get("user"), "presence_penalty": 0.0, "frequency_penalty": 0.0,
        "kv_transfer_params": None, "ec_transfer_params": None, "input_messages": None,
        "output_messages": None,
    }  # fmt: skip


def _given(request: dict[str, Any], key: str, default: Any) -> Any:
    value = request.get(key)
    return default if value is None else value


def response_done(
    base: dict[str, Any], item: dict[str, Any], prompt: int, output: int, finish: str
) -> dict[str, Any]:
    """The finished response: its message, usage and status (`incomplete` when the
    output cap cut it, as vLLM reports a `length` finish)."""
    cut = finish == "length"
    return base | {
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "output": [item],
        "usage": responses_usage(prompt, output),
    }


# -- Anthropic's Messages API (vLLM: entrypoints/anthropic/protocol.py, serving.py) ---------
def anthropic_stop_reason(finish: str) -> str:
    return "max_tokens" if finish == "length" else "end_turn"  # _to_anthropic_stop_reason


def anthropic_message(
    rid: str, model: str, text: str, prompt: int, output: int, finish: str
) -> dict[str, Any]:
    """AnthropicMessagesResponse dumped with exclude_none (stop_sequence left out); vLLM
    reuses the chat completion's id ("chatcmpl-..."), not Anthropic's "msg_..."."""
    return {"id": rid, "type": "message", "role": "assistant",
            "content": [{"type": "text", "text": text}], "model": model,
            "stop_reason": anthropic_stop_reason(finish),
            "usage": {"input_tokens": prompt, "output_tokens": output}}  # fmt: skip


class StreamedIds:
    """vLLM's `return_token_ids` on a stream: each choice's token ids, and the prompt's in the
    first event (chat: the chunk's; completions: its choice's). A text prompt's ids are
    the fake tokenizer's, padded or cut to the count the fake reports for it."""

    __slots__ = ("prompt_ids",)

    def __init__(self, prompt_ids: list[int] | None) -> None:
        self.prompt_ids = prompt_ids  # until the first event has carried them

    @classmethod
    def asked(cls, body: dict, prompt: int) -> StreamedIds | None:
        if body.get("return_token_ids") is not True:
            return None
        return cls(prompt_token_ids(body, prompt))

    def add(self, chunk: dict[str, Any], n: int) -> dict[str, Any]:
        choice = chunk["choices"][0]
        choice["token_ids"] = [TOKEN_ID] * n
        if self.prompt_ids is not None:
            holder = chunk if "delta" in choice else choice
            holder["prompt_token_ids"], self.prompt_ids = self.prompt_ids, None
        return chunk


def prompt_token_ids(body: dict, prompt: int) -> list[int]:
    """A prompt's ids: a token-id prompt's own; a text prompt's, the fake tokenizer's padded
    or cut to the count the fake reports for it."""
    if id_prompt(body):
        return list(body["prompt"])
    given, messages = body.get("prompt"), body.get("messages")
    ids = encode(given) if isinstance(given, str) else message_ids(messages or []) or []
    return (ids + [0] * prompt)[:prompt]


def already_written(body: dict) -> int:
    """The tokens of the answer a request continues: the assistant's turn it continues
    (`continue_final_message`), or the fake's output tokens ending a token-id prompt (a
    continuation from ids: the prompt's and the answer's)."""
    if id_prompt(body):
        prompt = body["prompt"]
        return next((i for i, t in enumerate(reversed(prompt)) if t != TOKEN_ID), len(prompt))
    messages = body.get("messages")
    if not body.get("continue_final_message") or not isinstance(messages, list) or not messages:
        return 0
    last = messages[-1]
    text = last.get("content") if isinstance(last, dict) else None
    return estimate_tokens(text) if isinstance(text, str) and text else 0
