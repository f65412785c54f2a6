"""Parse an OpenAI request body once: validate it and extract what the scheduler needs.

The body is forwarded unchanged (the raw bytes); only this summary is kept."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass

import orjson
from gpuroute.router.api.bodies import BodyError, BodySummary
from gpuroute.router.api.table import APIS, Api
from gpuroute.router.core.request import RequestInfo

from gpuroute.audio import AudioError, parse_audio_form
from gpuroute.audio_duration import audio_duration_s
from gpuroute.auth import printable_ascii
from gpuroute.openai_api import TOO_DEEP, clip, json_too_deep
from gpuroute.prompt import prefix_blocks

# Whisper's encoder sees 50 frames per second of audio (1,500 per 30 s window): the audio's
# prefill, in tokens; a transcript runs at most ~4 tokens per second of speech (fast speech
# is ~3.5 words/s): its output cap
AUDIO_TOKENS_PER_S = 50
TRANSCRIPT_TOKENS_PER_S = 4
PRIORITY_HEADER = "x-gpuroute-priority"
DEADLINE_HEADER = "x-gpuroute-deadline-ms"
SESSION_HEADERS = ("x-session-id", "x-gpuroute-session")


class RequestError(Exception):
    """A request we refuse, with the HTTP status and OpenAI error fields to answer with."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


@dataclass(slots=True)
class ParsedRequest:
    info: RequestInfo
    stream: bool
    deadline_s: float | None  # relative, from the deadline header
    outputs: int = 1  # answers it asks for: `n` (or `best_of`) times the prompts it holds
    api: Api | None = None  # which API (None: a passthrough path)
    audio_s: float | None = None  # an audio upload's duration: what it is metered in
    body: dict | None = None  # the JSON body as parsed (None: an audio upload's form)
    edited: bool = False  # `body` no longer says what the raw bytes say (it is sent instead)
    form: Mapping[str, tuple[str, ...]] | None = None  # an audio upload's other form fields


def parse_request(
    path: str,
    raw: bytes,
    headers: Mapping[str, str],
    request_id: int,
    *,
    priorities: tuple[str, ...],
    default_priority: str,
    with_prefix_blocks: bool = True,
    longest_deadline_s: float = math.inf,
    apis: Mapping[str, Api] = APIS,
    content_type: str | None = None,
    body: dict | None = None,
) -> ParsedRequest:
    """`with_prefix_blocks=False` skips hashing the prompt when no policy reads the blocks;
    the deadline header may only shorten `longest_deadline_s` (the router's default).
    `content_type` is the request's (audio uploads are multipart); `body`, the JSON body
    when it was parsed (and edited) already: `raw` is not read again."""
    api = apis.get(path)
    if api is None:
        raise RequestError(404, f"no API at {clip(path)}", code="not_found")
    if api.read is None:
        model, summary, audio_s, form = _audio_body(raw, content_type)
        body = None
    else:
        model, summary, body = _json_body(api, raw, body)
        audio_s, form = None, None
    priority = headers.get(PRIORITY_HEADER, default_priority).strip().lower()
    if priority not in priorities:
        raise RequestError(
            400,
            f"unknown priority {clip(priority)!r}; known: {', '.join(priorities)}",
            param=PRIORITY_HEADER,
        )
    deadline_s = _deadline_s(headers.get(DEADLINE_HEADER))
    if deadline_s is not None:
        deadline_s = min(deadline_s, longest_deadline_s)
    session = _session(headers, body)
    info = RequestInfo(
        request_id,
        model,
        summary.tokens,
        summary.max_tokens,
        session_id=session,
        prefix_blocks=prefix_blocks(summary.text) if with_prefix_blocks else (),
        priority=priority,
        holds=api.holds,
    )
    return ParsedRequest(
        info, summary.stream, deadline_s, summary.outputs, api, audio_s, body, form=form
    )


def _json_body(api: Api, raw: bytes, body: dict | None) -> tuple[str, BodySummary, dict]:
    body = json_object(raw) if body is None else body
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError(400, "'model' is required and must be a string", param="model")
    assert api.read is not None
    try:
        return model, api.read(body), body
    except BodyError as exc:
        raise RequestError(400, exc.message, param=exc.param) from None


def _audio_body(
    raw: bytes, content_type: str | None
) -> tuple[str, BodySummary, float, Mapping[str, tuple[str, ...]]]:
    """A transcription or translation upload: its model, its cost from the audio's
    duration as a decoder plays it (gpuroute/audio_duration.py), and the form's fields
    beyond those read here (the engine reads them: router/config/body_fields.py checks them)."""
    try:
        form = parse_audio_form(raw, content_type or "")
        seconds = audio_duration_s(form.file, form.filename, form.file_content_type)
    except AudioError as exc:
        raise RequestError(400, exc.message, param=exc.param) from None
    summary = BodySummary("", audio_tokens(seconds), transcript_tokens(seconds), form.stream, 1)
    return form.model, summary, seconds, form.extra


def audio_charge(seconds: float) -> int:
    """What audio of this length is charged in tokens: its prefill and its transcript cap."""
    return audio_tokens(seconds) + transcript_tokens(seconds)


def audio_tokens(seconds: float) -> int:
    return max(1, math.ceil(seconds * AUDIO_TOKENS_PER_S))


def transcript_tokens(seconds: float) -> int:
    return max(1, math.ceil(seconds * TRANSCRIPT_TOKENS_PER_S))


def _session(headers: Mapping[str, str], body: dict | None) -> str | None:
    """The session id (a header, else the body's `user`), as a fixed-length digest: the id
    becomes a Redis key and a hash input, and a client may send a megabyte of it."""
    for name in SESSION_HEADERS:
        if name in headers:
            value = headers[name]
            if not printable_ascii(value):
                raise RequestError(400, f"{name} must be printable ASCII", param=name)
            break
    else:
        value = body.get("user") if body is not None else None
        if not isinstance(value, str):
            return None
    return session_key(value)


def session_key(session: str) -> str:
    """A client's session id as the router keeps it: 32 hex characters, whatever its size."""
    return hashlib.blake2b(session.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def json_object(raw: bytes) -> dict:
    """A body that must be a JSON object, nested no deeper than the router can write it
    again (gpuroute/openai_api.py); RequestError (400) otherwise."""
    if json_too_deep(raw):
        raise RequestError(400, TOO_DEEP)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise RequestError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RequestError(400, "request body must be a JSON object")
    return body


def _deadline_s(header: str | None) -> float | None:
    if header is None:
        return None
    try:
        deadline_s = float(header) / 1000
    except ValueError:
        deadline_s = -1.0
    if not (deadline_s > 0 and math.isfinite(deadline_s)):
        raise RequestError(
            400, f"{DEADLINE_HEADER} must be a positive, finite number of milliseconds"
        )
    return deadline_s
