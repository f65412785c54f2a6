"""The splice: the continuing engine's stream rewritten as the rest of the first one (what a
client of a continued stream receives; gpuroute/continuation/text.py says what is sent)."""

from __future__ import annotations

import orjson

from gpuroute.continuation.seam import SeamWatch, stop_strings
from gpuroute.continuation.text import DATA, DONE, Broken, usage_event, usage_of
from gpuroute.openai_api import SSE_DONE


class Splice:
    """Rewrites the continuing engine's stream as the rest of the first one: its events
    carry the first stream's id, created and model; its role chunk is dropped; its usage
    counts the tokens sent before the break as completion, not prompt. A chat continued
    as a completion (`as_chat`) has its chunks read back as chat chunks."""

    __slots__ = ("as_chat", "before", "ended", "head", "partial", "prompt", "role_seen", "seam",
                 "sent")  # fmt: skip

    def __init__(self, broken: Broken, as_chat: bool = False, body: dict | None = None) -> None:
        self.head, self.before, self.as_chat = broken.head, broken.tokens, as_chat
        # the client's prompt, as the engine counted it (None: known only less `before`)
        self.prompt = None if broken.prompt_ids is None else len(broken.prompt_ids)
        self.partial = b""
        self.role_seen = False
        # a stop string across the seam ends the answer here (the engine cannot see it)
        self.seam = SeamWatch(body, broken.text) if body and stop_strings(body) else None
        self.sent = 0  # the continuation's tokens relayed while the seam was open
        self.ended = False  # by the seam: what follows is dropped, the upstream closed

    def feed(self, data: bytes) -> bytes:
        """The whole events of `data` (after what was held back) rewritten; a torn last
        event is held until its end comes."""
        if self.ended:
            return b""
        data = self.partial + data
        cut = data.rfind(b"\n\n")
        if cut < 0:
            self.partial = data
            return b""
        self.partial = data[cut + 2 :]
        out = b""
        for event in data[: cut + 2].split(b"\n\n"):
            out += self._event(event)
            if self.ended:
                break  # (a stop string across the seam: nothing after it)
        return out

    def flush(self) -> bytes:
        """What was held back when the stream ended (an unterminated last event)."""
        held, self.partial = self.partial, b""
        return self._event(held) if held.strip() and not self.ended else b""

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
        chunk.pop("prompt_token_ids", None)  # the continuation's: prompt and text so far
        for choice in chunk.get("choices") or ():
            if isinstance(choice, dict):
                choice.pop("prompt_token_ids", None)
                if self.as_chat and "text" in choice:
                    text = choice.pop("text")
                    choice["delta"] = {"content": text} if text else {}
        if self.as_chat:
            chunk["object"] = "chat.completion.chunk"
        if not self._without_role(chunk):
            return b""
        if isinstance(usage := chunk.get("usage"), dict):
            self._whole_usage(usage)
        ending = self._through_seam(chunk)
        return DATA + orjson.dumps(chunk) + b"\n\n" + ending

    def _through_seam(self, chunk: dict) -> bytes:
        """Counts the chunk's tokens and passes its text through the seam (which may hold
        some back); where a stop string completes across the seam, its text up to there,
        finished `stop`, then usage (the prompt known) and [DONE]."""
        choice = next((c for c in chunk.get("choices") or () if isinstance(c, dict)), None)
        if self.seam is None or self.seam.done or choice is None:
            return b""
        holder = choice.get("delta") if isinstance(choice.get("delta"), dict) else choice
        key = "content" if holder is not choice else "text"
        piece = holder.get(key)
        ids = choice.get("token_ids")  # (counted while the seam may still end the answer)
        self.sent += len(ids) if isinstance(ids, list) else int(bool(piece))
        text, stop = self.seam.feed(piece) if isinstance(piece, str) else ("", None)
        if stop is None and choice.get("finish_reason") is not None:
            text += self.seam.release()  # its engine finished within the seam
        if isinstance(piece, str) or text:
            holder[key] = text
        if stop is None:
            return b""
        choice.pop("token_ids", None)  # (they may run past the stop)
        choice["finish_reason"], choice["stop_reason"] = "stop", stop
        self.ended = True
        if self.prompt is None:
            return SSE_DONE  # no usage the router could vouch for
        kind = chunk.get("object")
        return usage_event(self.head, kind, self.prompt, self.before + self.sent) + SSE_DONE

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
            asked = self.prompt if self.prompt is not None else max(prompt - self.before, 0)
            usage.update(usage_of(asked, completion + self.before))
