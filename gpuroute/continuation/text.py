"""What a stream whose engine broke mid-answer needs to go on elsewhere: whether it can be
continued faithfully (and if not, why), the text it had when it broke, and the request that
continues it (Dynamo's migration, done at the router; gpuroute/continuation/splice.py makes
the new engine's stream read as the rest of the first one).

The continuation resends the prompt plus the text so far: for chat as the assistant's
turn continued (`continue_final_message: true, add_generation_prompt: false`, which vLLM
and SGLang take), for completions as prompt + text; `max_tokens` less what was sent, the
sampling parameters and stop sequences kept. Where the engine streamed its token ids
(vLLM's `return_token_ids`, asked for on the client's behalf: `ask_token_ids`), the count
of tokens sent is exact, and a completions prompt goes on as ids (the prompt's and the
answer's), so nothing is tokenized again; chat takes no token-id prompt, so its text is.
The client then sees one stream: the same id, created and model, no second role chunk,
one finish, and usage (where it asked for usage) that covers the whole answer."""

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
LOGPROBS = ("logprobs", "top_logprobs")
# what a chat request says that a completion from the chat's token ids does not take
CHAT_ONLY = frozenset({
    "messages", "tools", "tool_choice", "parallel_tool_calls", "functions", "function_call",
    "chat_template", "chat_template_kwargs", "add_generation_prompt", "continue_final_message",
    "documents", "reasoning_effort", "include_reasoning", "max_completion_tokens",
    "modalities", "audio", "mm_processor_kwargs", "media_io_kwargs", "prediction", "store",
    "metadata", "web_search_options",
})  # fmt: skip


class ContinuationConfig(StrictModel):
    """The `[continuation]` section: streams whose engine breaks mid-answer go on elsewhere."""

    enabled: bool = True
    max_attempts: int = Field(default=2, ge=1, le=10)  # continuations of one stream
    # what is kept of a stream to continue it; a longer answer ends with the explicit error
    max_recorded_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    # ask engines to stream their token ids (vLLM's `return_token_ids`, stripped from what
    # a client that did not ask receives): exact counts, token-id continuations
    token_ids: bool = True


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
    if route == COMPLETIONS and not (isinstance(body.get("prompt"), str) or id_prompt(body)):
        return "prompt_not_text"  # a batch: no one text to go on from
    if route == CHAT and not isinstance(body.get("messages"), list):
        return "route"
    return None


def id_prompt(body: dict) -> bool:
    """A completions prompt of token ids: it goes on only from the answer's ids."""
    prompt = body.get("prompt")
    return isinstance(prompt, list) and bool(prompt) and all(type(t) is int for t in prompt)


@dataclass(slots=True)
class Broken:
    """What the client received of a stream before its engine broke."""

    text: str = ""
    tokens: int = 0  # sent so far: events with text, or the text's estimate if more
    events: int = 0  # events with text: no more tokens than were sent
    usage: bool = False  # its usage chunk came
    head: dict = field(default_factory=dict)  # id, created, model, as the client saw them
    finished: bool = False  # its finish came: only the end of the stream was lost
    tool_calls: bool = False
    reasoning: bool = False  # reasoning text streamed apart from the answer
    unread: bool = False  # an event that is not JSON data: its text cannot be known
    prompt_ids: list[int] | None = None  # the prompt as the engine tokenized it
    # the answer's token ids, where every event with text carried them (None: not all did)
    token_ids: list[int] | None = field(default_factory=list)

    @property
    def exact(self) -> bool:
        """The prompt's and the answer's token ids are both known: it goes on from ids."""
        return self.prompt_ids is not None and self.token_ids is not None


def read_broken(stream: bytes, route: str, ids: bool = True) -> Broken:
    """The events the client received (`stream`, whole events), read for their text, their
    head and whether they finished; without `ids`, the answer's token ids are not trusted
    (its text lags them: gpuroute/continuation/seam.py `holds_back`)."""
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
        _prompt_ids(chunk, broken)
        broken.usage |= isinstance(chunk.get("usage"), dict)
        for choice in chunk.get("choices") or ():
            piece = _piece(choice, route, broken)
            if piece:
                broken.text += piece
                events += 1
            _answer_ids(choice, bool(piece), broken)
            broken.finished |= choice.get("finish_reason") is not None
    broken.events = events
    if ids and broken.token_ids is not None and (broken.token_ids or not broken.text):
        broken.tokens = len(broken.token_ids)  # as the engine counted them
    else:  # a token an event as engines stream by default; more where one packs several
        broken.token_ids = None
        broken.tokens = max(events, estimate_tokens(broken.text)) if broken.text else 0
    return broken


def _prompt_ids(chunk: dict, broken: Broken) -> None:
    """The prompt's ids from the first event that has them (chat: the chunk; completions:
    its choice)."""
    if broken.prompt_ids is not None:
        return
    ids = chunk.get("prompt_token_ids")
    if ids is None and (choices := chunk.get("choices")) and isinstance(choices[0], dict):
        ids = choices[0].get("prompt_token_ids")
    if isinstance(ids, list) and all(isinstance(i, int) for i in ids):
        broken.prompt_ids = ids


def _answer_ids(choice: dict, has_text: bool, broken: Broken) -> None:
    ids = choice.get("token_ids")
    if broken.token_ids is None:
        return
    if isinstance(ids, list) and all(isinstance(i, int) for i in ids):
        broken.token_ids += ids
    elif has_text:
        broken.token_ids = None  # text without its ids: the count is the text's


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


def sent_as(route: str, body: dict, broken: Broken) -> str:
    """The route a continuation goes to: a chat whose prompt and answer came as token ids
    goes on as a completion from those ids (chat takes no token-id prompt; the chat
    template is in the prompt's ids), unless the ids may not say it all (images, tools)."""
    if route != CHAT or not broken.exact:
        return route
    if any(body.get(name) for name in ("tools", "functions")):
        return route  # a tool call later in the answer is parsed only by the chat API
    return COMPLETIONS if all(_text_only(m) for m in body.get("messages") or ()) else route


def _text_only(message: object) -> bool:
    content = message.get("content") if isinstance(message, dict) else None
    if content is None or isinstance(content, str):
        return True
    return isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" for p in content
    )


def continuation_body(body: dict, route: str, broken: Broken) -> dict:
    """The request that continues `body` from `broken`'s text, for the route `sent_as`
    says (usage asked for: the splice makes it cover the whole answer)."""
    if sent_as(route, body, broken) != route:
        # (a chat's logprobs false or top_logprobs 0 would ask a completion for logprobs)
        out = {k: v for k, v in body.items() if k not in CHAT_ONLY and k not in LOGPROBS}
        out.pop("max_tokens", None)
        if (cap := output_cap(body)) is not None:
            out["max_tokens"] = cap
        out["prompt"] = broken.prompt_ids + broken.token_ids  # type: ignore[operator]
    elif route == CHAT:
        out = copy.deepcopy(body)
        _continue_turn(out, broken.text)
    else:
        out = copy.deepcopy(body)
        if broken.exact:  # nothing tokenized again
            out["prompt"] = broken.prompt_ids + broken.token_ids  # type: ignore[operator]
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


def _continue_turn(out: dict, text: str) -> None:
    """The assistant's turn continued with `text` (vLLM's and SGLang's continue_final_message)."""
    messages = out["messages"]
    last = messages[-1] if messages else None
    if out.get("continue_final_message") and isinstance(last, dict):
        content = last.get("content")
        if isinstance(content, list):  # content parts: the text goes on as one more
            content.append({"type": "text", "text": text})
        else:
            last["content"] = (content or "") + text
    else:
        messages.append({"role": "assistant", "content": text})
    out["continue_final_message"], out["add_generation_prompt"] = True, False


def prepare(
    config: ContinuationConfig, route: str, stream: bool, body: dict | None
) -> tuple[bool, bool]:
    """Whether a request's stream may be continued (kept as it goes: judged once, here),
    and whether its token ids were asked for on its client's behalf (stripped from what it
    receives)."""
    if not (stream and config.enabled and static_reason(route, body) is None):
        return False, False
    return True, config.token_ids and ask_token_ids(body)


def ask_token_ids(body: dict | None) -> bool:
    """Ask the engine to stream its token ids; True: the client did not ask, so they are
    stripped from what it receives."""
    if body is None or body.get("return_token_ids") is True:
        return False
    body["return_token_ids"] = True
    return True


def budget_spent(body: dict, broken: Broken) -> bool:
    """Its cap reached before the break: the answer is whole but for its finish."""
    cap = output_cap(body)
    sure = broken.tokens if broken.token_ids is not None else broken.events  # (no more)
    return cap is not None and sure >= cap


def output_cap(body: dict) -> int | None:
    """The request's cap on output tokens (`max_completion_tokens` first, as engines read it)."""
    caps = (body.get("max_completion_tokens"), body.get("max_tokens"))
    return next((c for c in caps if isinstance(c, int)), None)


def finish_events(broken: Broken, route: str, reason: str | None) -> bytes:
    """The end of a stream whose engine broke after its last token: a final chunk with
    `reason` as its finish (None: its finish came already), then [DONE]."""
    kind = "text_completion" if route == COMPLETIONS else "chat.completion.chunk"
    last = b""
    if reason is not None:
        choice = {"index": 0, "finish_reason": reason}
        choice.update({"text": ""} if route == COMPLETIONS else {"delta": {}})
        last = sse_event({**broken.head, "object": kind, "choices": [choice]})
    if not broken.usage and broken.exact:  # as the engine counted them
        counts = len(broken.prompt_ids or ()), len(broken.token_ids or ())
        last += usage_event(broken.head, kind, *counts)
    return last + SSE_DONE


def usage_of(prompt: int, completion: int) -> dict[str, int]:
    """OpenAI's usage object."""
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}  # fmt: skip


def usage_event(head: dict, kind: object, prompt: int, completion: int) -> bytes:
    """A usage-only chunk (no choices), as engines end a stream that asked for usage."""
    return sse_event({**head, "object": kind, "choices": [], "usage": usage_of(prompt, completion)})
