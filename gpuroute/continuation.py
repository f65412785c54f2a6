"""What a stream whose engine broke mid-answer needs to go on elsewhere: whether it can be
continued faithfully (and if not, why), the text it had when it broke, the request that
continues it, and the splice that makes the new engine's stream read as the rest of the
first one (Dynamo's migration, done at the router).

The continuation resends the prompt plus the text so far: for chat as the assistant's
turn continued (`continue_final_message: true, add_generation_prompt: false`, which vLLM
and SGLang take), for completions as prompt + text; `max_tokens` less what was sent, the
sampling parameters and stop sequences kept. The client then sees one stream: the same
id, created and model, no second role chunk, one finish, and usage (where it asked for
usage) that covers the whole answer."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import orjson
from pydantic import Field

from gpuroute.config import StrictModel
from gpuroute.openai_api import SSE_DONE, sse_event
from gpuroute.prompt import estimate_tokens

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
ROUTES = frozenset({CHAT, COMPLETIONS})
# request fields whose answer a continuation cannot reproduce, each with its reason
GUIDED = ("response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
          "structured_outputs", "guided_decoding_backend")  # fmt: skip
DATA, DONE = b"data: ", SSE_DONE.strip()


class ContinuationConfig(StrictModel):
    """The `[continuation]` section: streams whose engine breaks mid-answer go on elsewhere."""

    enabled: bool = True
    max_attempts: int = Field(default=2, ge=1, le=10)  # continuations of one stream
    # what is kept of a stream to continue it; a longer answer ends with the explicit error
    max_recorded_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)


def static_reason(route: str, body: dict | None) -> str | None:
    """Why a request can never be continued faithfully (None: it can, so far)."""
    if route not in ROUTES or body is None:
        return "route"
    if (body.get("n") or 1) != 1 or (body.get("best_of") or 1) != 1:
        return "n"
    logprobs = (body.get("logprobs"), body.get("top_logprobs"), body.get("prompt_logprobs"))
    if any(v is not None and v is not False for v in logprobs) or body.get("echo"):
        return "logprobs"  # (completions' logprobs 0 asks for them too)
    if any(body.get(name) for name in GUIDED):
        return "guided_decoding"
    if body.get("seed") is not None:
        return "seed"
    if route == COMPLETIONS and not isinstance(body.get("prompt"), str):
        return "prompt_not_text"  # token ids or a batch: the text cannot be appended
    if route == CHAT and not isinstance(body.get("messages"), list):
        return "route"
    return None


@dataclass(slots=True)
class Broken:
    """What the client received of a stream before its engine broke."""

    text: str = ""
    tokens: int = 0  # sent so far: events with text, or the text's estimate if more
    head: dict = field(default_factory=dict)  # id, created, model, as the client saw them
    finished: bool = False  # its finish came: only the end of the stream was lost
    tool_calls: bool = False
    reasoning: bool = False  # reasoning text streamed apart from the answer
    unread: bool = False  # an event that is not JSON data: its text cannot be known


def read_broken(stream: bytes, route: str) -> Broken:
    """The events the client received (`stream`, whole events), read for their text, their
    head and whether they finished."""
    broken = Broken()
    events = 0
    for event in stream.split(b"\n\n"):
        event = event.strip()
        if not event or event.startswith((b":", DONE)):
            continue  # a comment (a keep-alive), the end
        try:
            chunk = orjson.loads(event[len(DATA) :]) if event.startswith(DATA) else None
        except orjson.JSONDecodeError:
            chunk = None
        if not isinstance(chunk, dict):
            broken.unread = True
            continue
        if not broken.head:
            broken.head = {k: chunk[k] for k in ("id", "created", "model") if k in chunk}
        for choice in chunk.get("choices") or ():
            piece = _piece(choice, route, broken)
            if piece:
                broken.text += piece
                events += 1
            broken.finished |= choice.get("finish_reason") is not None
    # a token an event as engines stream by default; more where one packs several
    broken.tokens = max(events, estimate_tokens(broken.text)) if broken.text else 0
    return broken


def _piece(choice: dict, route: str, broken: Broken) -> str:
    if route == COMPLETIONS:
        return choice.get("text") or ""
    delta = choice.get("delta") or {}
    if delta.get("tool_calls"):
        broken.tool_calls = True
    if delta.get("reasoning_content") or delta.get("reasoning"):
        broken.reasoning = True
    content = delta.get("content")
    return content if isinstance(content, str) else ""


def continuation_body(body: dict, route: str, broken: Broken) -> dict:
    """The request that continues `body` from `broken`'s text (usage asked for: the splice
    makes it cover the whole answer)."""
    out = copy.deepcopy(body)
    if route == CHAT:
        messages = out["messages"]
        last = messages[-1] if messages else None
        if out.get("continue_final_message") and isinstance(last, dict):
            content = last.get("content")
            if isinstance(content, list):  # content parts: the text goes on as one more
                content.append({"type": "text", "text": broken.text})
            else:
                last["content"] = (content or "") + broken.text
        else:
            messages.append({"role": "assistant", "content": broken.text})
        out["continue_final_message"], out["add_generation_prompt"] = True, False
    else:
        out["prompt"] = out["prompt"] + broken.text
    for cap in ("max_tokens", "max_completion_tokens"):
        if isinstance(out.get(cap), int):
            out[cap] = max(out[cap] - broken.tokens, 1)
    if isinstance(out.get("min_tokens"), int):  # counts the new output only
        out["min_tokens"] = max(out["min_tokens"] - broken.tokens, 0)
    out["stream"] = True
    out["stream_options"] = {**(out.get("stream_options") or {}), "include_usage": True}
    return out


def budget_spent(body: dict, broken: Broken) -> bool:
    """Its cap reached before the break: the answer is whole but for its finish."""
    caps = [body.get(cap) for cap in ("max_completion_tokens", "max_tokens")]
    cap = next((c for c in caps if isinstance(c, int)), None)
    return cap is not None and broken.tokens >= cap


def finish_events(broken: Broken, route: str, reason: str | None) -> bytes:
    """The end of a stream whose engine broke after its last token: a final chunk with
    `reason` as its finish (None: its finish came already), then [DONE]."""
    if reason is None:
        return SSE_DONE
    choice = {"index": 0, "finish_reason": reason}
    choice.update({"text": ""} if route == COMPLETIONS else {"delta": {}})
    kind = "text_completion" if route == COMPLETIONS else "chat.completion.chunk"
    return sse_event({**broken.head, "object": kind, "choices": [choice]}) + SSE_DONE


class Splice:
    """Rewrites the continuing engine's stream as the rest of the first one: its events
    carry the first stream's id, created and model; its role chunk is dropped; its usage
    counts the tokens sent before the break as completion, not prompt."""

    __slots__ = ("before", "head", "partial", "role_seen")

    def __init__(self, broken: Broken) -> None:
        self.head, self.before = broken.head, broken.tokens
        self.partial = b""
        self.role_seen = False

    def feed(self, data: bytes) -> bytes:
        """The whole events of `data` (after what was held back) rewritten; a torn last
        event is held until its end comes."""
        data = self.partial + data
        cut = data.rfind(b"\n\n")
        if cut < 0:
            self.partial = data
            return b""
        self.partial = data[cut + 2 :]
        events = (self._event(e) for e in data[: cut + 2].split(b"\n\n"))
        return b"".join(e for e in events if e)

    def flush(self) -> bytes:
        """What was held back when the stream ended (an unterminated last event)."""
        held, self.partial = self.partial, b""
        return self._event(held) if held.strip() else b""

    def _event(self, event: bytes) -> bytes:
        text = event.strip()
        if not text:
            return b""
        if not text.startswith(DATA) or text.startswith(DONE):
            return text + b"\n\n"
        try:
            chunk = orjson.loads(text[len(DATA) :])
        except orjson.JSONDecodeError:
            return text + b"\n\n"
        if not isinstance(chunk, dict):
            return text + b"\n\n"
        chunk.update(self.head)
        if not self._without_role(chunk):
            return b""
        if isinstance(usage := chunk.get("usage"), dict):
            self._whole_usage(usage)
        return DATA + orjson.dumps(chunk) + b"\n\n"

    def _without_role(self, chunk: dict) -> bool:
        """The continuing engine's first delta less its role; False: nothing else in it."""
        if self.role_seen:
            return True
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta")
            if isinstance(delta, dict) and "role" in delta:
                self.role_seen = True
                del delta["role"]
                empty = not delta.get("content") and len(delta) <= 1
                if empty and choice.get("finish_reason") is None and not chunk.get("usage"):
                    return False
        return True

    def _whole_usage(self, usage: dict) -> None:
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if isinstance(prompt, int) and isinstance(completion, int):
            usage["prompt_tokens"] = max(prompt - self.before, 0)
            usage["completion_tokens"] = completion + self.before
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
