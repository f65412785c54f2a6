"""The engine's usage, read from the whole answer as it passes, in bounded memory, so no
field before or after `usage` (vLLM's `prompt_logprobs`, `prompt_token_ids`, an embeddings
batch) can hide it: a JSON answer is parsed whole (orjson, up to 1 MiB) or as a stream
(ijson's push parser, past it); an SSE stream's events are split as they come and only
those naming `"usage"` are parsed. Every API's shape is read: OpenAI's completions family
and pooling routes, the Responses API (`response.usage`) and Anthropic's Messages
(`message.usage`, then `usage`)."""

from __future__ import annotations

import re
from typing import Any

import ijson
import orjson

USAGE_KEY = b'"usage"'
USAGE_NULL = b'"usage":null'  # what SGLang sends in every chunk (and vLLM's response.created)
USAGE_NULLS = re.compile(rb'"usage"\s*:\s*null')  # the same, spaced
# A partial SSE event held whole up to this many bytes; a longer one (a Responses
# `response.completed` carrying a long answer) is parsed as it comes instead. The same for
# a whole answer (a large embeddings batch, the prompt logprobs of a long prompt).
EVENT_HOLD = WHOLE_HOLD = 1 << 20
PARSE_BATCH = 1 << 18  # ... and past them, parsed this many bytes at a time
# a blank line, its lines ended with LF or CRLF (a CRLF's \r stays with the event before:
# a line's end to its data, whitespace to its JSON); led by "\n", which the regex engine
# finds as fast as bytes.find, where a leading optional "\r" has it try every byte
EVENT_END = re.compile(rb"\n\r?\n")
# a separator ends in a new chunk with at most this many of its bytes before it: "\n\r\n"
STRADDLE = 2
# where an event's usage sits: chat/completions chunks and Messages' message_delta,
# the Responses API's response.completed, Messages' message_start
EVENT_USAGE_PATHS = ("usage", "response.usage", "message.usage")
JSON_USAGE_PATHS = ("usage",)  # every whole answer: top level
PARSE_ERRORS = (ijson.JSONError, ijson.IncompleteJSONError, UnicodeDecodeError)


def names_usage(data: bytes) -> bool:
    """Whether `data` may hold a usage object: it names `"usage"` other than as null (JSON
    has no other place for those bytes than a key, or a value that no colon follows)."""
    named = data.count(USAGE_KEY)
    if not named:
        return False
    return named != data.count(USAGE_NULL) and named != len(USAGE_NULLS.findall(data))


def _count(usage: dict[str, Any], *names: str) -> int | None:
    """The first of `names` that holds a token count (an int, not negative)."""
    for name in names:
        value = usage.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def token_counts(usage: dict[str, Any] | None) -> tuple[int | None, int | None]:
    """(prompt, completion) tokens in a usage object, each None where it says nothing.
    Anthropic counts cache writes and reads apart from `input_tokens`: they are prompt
    too. The pooling routes (rerank, score) may give only `total_tokens`: all prompt."""
    if not usage:
        return None, None
    completion = _count(usage, "completion_tokens", "output_tokens")
    prompt = _count(usage, "prompt_tokens", "input_tokens")
    if prompt is not None and "prompt_tokens" not in usage:
        for cached in ("cache_creation_input_tokens", "cache_read_input_tokens"):
            prompt += _count(usage, cached) or 0
    if prompt is None:
        total = _count(usage, "total_tokens")
        if total is not None:
            prompt = max(total - (completion or 0), 0)
    return prompt, completion


class _StreamParse:
    """One JSON document parsed as its bytes come, collecting the objects at `paths`. Its
    bytes reach the parser PARSE_BATCH at a time: ijson's C parser reads a token cut
    between two sends again from its start, so a long string (a long answer's text) sent
    in 4 KB chunks cost its length squared (1.3 s for 3 MB)."""

    __slots__ = ("_parsers", "_pending", "_pending_size", "found")

    def __init__(self, paths: tuple[str, ...]) -> None:
        self.found = ijson.sendable_list()
        self._parsers = [ijson.items_coro(self.found, path) for path in paths]
        self._pending: list[bytes] = []
        self._pending_size = 0

    def send(self, data: bytes, *, flush: bool = False) -> bool:
        """Feed `data` (parsed once PARSE_BATCH bytes wait, or at once with `flush`: the
        document ends, or its usage is asked for); False once the document cannot be
        read further (malformed, or followed by more than whitespace)."""
        if data:
            self._pending.append(data)
            self._pending_size += len(data)
        if self._pending_size < PARSE_BATCH and not (flush and self._pending):
            return True
        data = b"".join(self._pending)
        self._pending, self._pending_size = [], 0
        try:
            for parser in self._parsers:
                parser.send(data)
        except PARSE_ERRORS:
            return False
        return True


class UsageReader:
    """Fed every chunk of an answer; `usage` is the engine's usage object, the latest value
    of each field winning (a stream with continuous usage stats sends one in every chunk;
    Messages sends input tokens first and output tokens last). Whether the answer is one
    JSON document or an SSE stream is told by its first byte. A whole answer up to
    WHOLE_HOLD bytes is kept and parsed once, when its usage is asked for (orjson: what
    nearly every answer is); a longer one is parsed as it comes (ijson), in bounded memory."""

    __slots__ = (
        "_event", "_held", "_json", "_kept", "_partial", "_partial_size", "_read_at", "_sse",
        "_usage",
    )  # fmt: skip

    def __init__(self) -> None:
        self._usage: dict[str, Any] | None = None
        self._sse: bool | None = None  # None: no byte seen yet
        self._kept: list[bytes] | None = None  # a whole answer's chunks, while short
        self._held = 0  # their bytes
        self._read_at = -1  # how many of them `usage` has read
        self._json: _StreamParse | None = None  # a long whole answer, while it parses
        # an SSE event not ended yet, in the chunks it came in (joined once it ends: a long
        # event in small chunks is not copied again with each one)
        self._partial: list[bytes] = []
        self._partial_size = 0
        self._event: _StreamParse | None = None  # an SSE event too long to hold, parsing

    @property
    def usage(self) -> dict[str, Any] | None:
        if self._kept is not None and self._read_at != self._held:
            self._read_at = self._held
            self._usage = None
            self._read_whole(b"".join(self._kept))
        elif self._json is not None:
            self._feed_json(b"", flush=True)
        if self._event is not None:  # (a stream cut short in a long event)
            self._event.send(b"", flush=True)
            self._take(self._event.found)
        return self._usage

    def feed(self, chunk: bytes) -> None:
        if self._sse:  # the hot path: whole events that name no usage pass at a glance
            if (
                self._partial
                or self._event is not None
                or not chunk.endswith(b"\n\n")
                or names_usage(chunk)
            ):
                self._feed_events(chunk)
        elif self._kept is not None:
            self._keep(chunk)
        elif self._json is not None:
            self._feed_json(chunk)
        elif self._sse is None and (head := chunk.lstrip()):
            self._sse = not head.startswith(b"{")
            if self._sse:
                self._feed_events(chunk)
            else:
                self._kept = []
                self._keep(chunk)

    def _keep(self, chunk: bytes) -> None:
        assert self._kept is not None
        self._kept.append(chunk)
        self._held += len(chunk)
        if self._held > WHOLE_HOLD:  # too long to keep: parsed from here on as it comes
            data, self._kept, self._usage = b"".join(self._kept), None, None
            self._json = _StreamParse(JSON_USAGE_PATHS)
            self._feed_json(data)

    def _read_whole(self, body: bytes) -> None:
        """A kept answer's top-level usage (one that does not parse whole, cut short or
        followed by more bytes: what its parse as a stream found before that)."""
        try:
            document = orjson.loads(body)
        except orjson.JSONDecodeError:
            parse = _StreamParse(JSON_USAGE_PATHS)
            parse.send(body, flush=True)
            self._take(parse.found)
            return
        usage = document.get("usage") if isinstance(document, dict) else None
        if isinstance(usage, dict):
            self._merge(usage)

    def _feed_json(self, chunk: bytes, *, flush: bool = False) -> None:
        assert self._json is not None
        readable = self._json.send(chunk, flush=flush)
        self._take(self._json.found)
        if not readable:
            self._json = None  # what it found stands; nothing more is read

    def _feed_events(self, chunk: bytes) -> None:
        if self._event is not None:
            chunk = self._feed_long_event(chunk)
            if not chunk:
                return
        tail = self._tail()  # where a separator may begin before `chunk`
        end = _last_end(tail + chunk if tail else chunk)
        if end < 0:  # the event goes on: only this chunk was searched
            self._hold(chunk)
            return
        end -= len(tail)  # where it ends in `chunk` (< 0: in the held part)
        data = b"".join([*self._partial, chunk]) if self._partial else chunk
        ends_at = len(data) - len(chunk) + end
        whole, rest = data[:ends_at], data[ends_at:]
        self._partial, self._partial_size = [], 0
        if USAGE_KEY in whole:
            for event in EVENT_END.split(whole):
                if names_usage(event):
                    self._read_event(event)
        if rest:
            self._hold(rest)

    def _tail(self) -> bytes:
        """The held event's last STRADDLE bytes (it holds no whole separator)."""
        if not self._partial:
            return b""
        tail = self._partial[-1][-STRADDLE:]
        if len(tail) < STRADDLE and len(self._partial) > 1:
            tail = b"".join(self._partial[-STRADDLE:])[-STRADDLE:]
        return tail

    def _hold(self, part: bytes) -> None:
        """`part` of an event not ended yet kept; an event past EVENT_HOLD bytes parsed
        from here on as it comes instead."""
        if not part:
            return
        self._partial.append(part)
        self._partial_size += len(part)
        if self._partial_size > EVENT_HOLD:
            held = b"".join(self._partial)
            self._partial, self._partial_size = [], 0
            self._start_long_event(held)

    def _read_event(self, event: bytes) -> None:
        """An event's usage, read from its `data` lines."""
        try:
            document = orjson.loads(event_data(event))
        except orjson.JSONDecodeError:
            return
        if not isinstance(document, dict):
            return
        usage = document.get("usage")
        for holder in ("response", "message"):
            inner = document.get(holder)
            if usage is None and isinstance(inner, dict):
                usage = inner.get("usage")
        if isinstance(usage, dict):
            self._merge(usage)

    def _start_long_event(self, held: bytes) -> None:
        """An event longer than EVENT_HOLD: parsed from its `data:` on, as it comes."""
        at = held.find(b"data:")
        if at < 0:
            return  # not data (a comment, say): nothing to read
        self._event = _StreamParse(EVENT_USAGE_PATHS)
        self._feed_long_event(held[at + 5 :])

    def _feed_long_event(self, chunk: bytes) -> bytes:
        """Feed the long event what of `chunk` is its; what follows its end is returned.
        Its trailing newlines wait in `_partial` (its end may span two chunks)."""
        assert self._event is not None
        if self._partial:  # (its trailing newlines, a few bytes)
            chunk = b"".join([*self._partial, chunk])
            self._partial, self._partial_size = [], 0
        end = EVENT_END.search(chunk)
        if end is None:
            part, rest = chunk.rstrip(b"\r\n"), b""
            if len(chunk) > len(part):
                self._partial, self._partial_size = [chunk[len(part) :]], len(chunk) - len(part)
        else:
            part, rest = chunk[: end.start()], chunk[end.end() :]
        event = self._event
        readable = event.send(part, flush=end is not None)
        self._take(event.found)
        if end is not None or not readable:
            self._event = None  # (an unreadable one: what is left of it reads as no event)
        return rest

    def _take(self, found: list) -> None:
        for usage in found:
            if isinstance(usage, dict):
                self._merge(usage)
        found.clear()

    def _merge(self, usage: dict[str, Any]) -> None:
        fields = {k: v for k, v in usage.items() if v is not None}
        self._usage = fields if self._usage is None else self._usage | fields


def _last_end(data: bytes) -> int:
    """Where the last event separator in `data` ends (a blank line: `\n\n`, its lines
    ended with CRLF or LF alike), or -1."""
    lf = data.rfind(b"\n\n")
    end = lf + 2 if lf >= 0 else -1
    if b"\r" in data and (crlf := data.rfind(b"\n\r\n")) >= 0:
        end = max(end, crlf + 3)
    return end


def event_data(event: bytes) -> bytes:
    """An SSE event's data: its `data` lines' values, joined by newlines."""
    lines = [line for line in event.splitlines() if line.startswith(b"data:")]
    values = [line[6:] if line[5:6] == b" " else line[5:] for line in lines]
    return values[0] if len(values) == 1 else b"\n".join(values)
