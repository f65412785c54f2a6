"""The fake engine's /tokenize and /detokenize (vLLM: entrypoints/serve/tokenize/), with a
tokenizer that counts as gpuroute.prompt estimates: 4 ASCII characters a token, any other
character a token of its own (exactly so for ASCII text; in mixed text another character
also ends the ASCII run before it, so a count may be a little higher than the estimate).
Ids are the text itself, so /detokenize inverts /tokenize:
an ASCII run of 1-4 characters is 0x01 followed by its bytes, read as a big-endian number;
another character is NON_ASCII plus its code point. Other ids detokenize to nothing, as
vLLM's out-of-vocabulary ids do. Neither route runs in the engine model (vLLM's renderer
answers them in the API server): no pacing, nothing in the metrics."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from gpuroute.testbed.fake_engine.common import ServingEngine, field_error, is_int, read_body

from gpuroute.openai_api import error_response

NON_ASCII = 1 << 48
MAX_ID = 2**63 - 1  # vLLM's DetokenizeRequest bound


def encode(text: str) -> list[int]:
    ids: list[int] = []
    run = ""
    for ch in text:
        if ch.isascii():
            run += ch
            if len(run) == 4:
                ids.append(_ascii_id(run))
                run = ""
            continue
        if run:
            ids.append(_ascii_id(run))
            run = ""
        ids.append(NON_ASCII + ord(ch))
    if run:
        ids.append(_ascii_id(run))
    return ids


def _ascii_id(run: str) -> int:
    return int.from_bytes(b"\x01" + run.encode("ascii"), "big")


def decode_one(token: int) -> str:
    if NON_ASCII <= token < NON_ASCII + 0x110000:
        ch = chr(token - NON_ASCII)
        return "" if 0xD800 <= ord(ch) <= 0xDFFF else ch
    raw = token.to_bytes(max(1, (token.bit_length() + 7) // 8), "big")
    if 2 <= len(raw) <= 5 and raw[0] == 1 and raw[1:].isascii():
        return raw[1:].decode("ascii")
    return ""


def decode(tokens: list[int]) -> str:
    return "".join(decode_one(t) for t in tokens)


def message_ids(messages: list[Any]) -> list[int] | None:
    """A chat's ids: each message's text tokenized in turn (the fake has no chat template,
    so the count equals what gpuroute.prompt counts for the same messages); None if a
    message is not an object with string or list content."""
    ids: list[int] = []
    for message in messages:
        if not isinstance(message, dict):
            return None
        content = message.get("content")
        if isinstance(content, str):
            ids += encode(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    ids += encode(part["text"])
        elif content is not None:
            return None
    return ids


class FakeTokenize:
    def __init__(self, engine: ServingEngine) -> None:
        self.engine = engine

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/tokenize", self.tokenize), web.post("/detokenize", self.detokenize)]

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await read_body(self.engine, request)
        if isinstance(body, web.Response):
            return body
        prompt, messages = body.get("prompt"), body.get("messages")
        if isinstance(prompt, str):
            ids: list[int] | None = encode(prompt)
        elif isinstance(messages, list):
            ids = message_ids(messages)
            if ids is None:
                return field_error("messages", "a list of messages")
        else:
            return error_response(400, "'prompt' (a string) or 'messages' is required",
                                  param="prompt")  # fmt: skip
        strings = [decode_one(t) for t in ids] if body.get("return_token_strs") else None
        answer = {"count": len(ids), "max_model_len": self.engine.max_model_len, "tokens": ids,
                  "token_strs": strings}  # fmt: skip
        return web.json_response(answer)

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await read_body(self.engine, request)
        if isinstance(body, web.Response):
            return body
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(is_int(t) and 0 <= t <= MAX_ID for t in tokens):
            return field_error("tokens", f"a list of token ids in 0..{MAX_ID}")
        return web.json_response({"prompt": decode(tokens)})
