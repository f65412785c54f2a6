"""Audio requests (`/v1/audio/transcriptions`, `/translations`): the multipart form OpenAI
clients send (the audio's duration is gpuroute/audio_duration.py's). The parser takes a
body the router has bounded (8 MiB by default), runs in time linear in it, and refuses what
it cannot read with `AudioError`, naming the field at fault for a 400."""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

_PART_HEADER_LIMIT = 8192  # bytes of headers per part: a name and a filename fit many times


class AudioError(ValueError):
    """A form or audio file the router refuses (400); `param` names the field at fault."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param = message, param


@dataclass(frozen=True, slots=True)
class AudioForm:
    """A transcription or translation request; `extra`: other fields' values, in order."""

    model: str
    file: bytes
    filename: str | None = None
    file_content_type: str | None = None
    language: str | None = None
    prompt: str | None = None
    response_format: str | None = None
    temperature: float | None = None
    timestamp_granularities: tuple[str, ...] = ()
    stream: bool = False
    extra: dict[str, tuple[str, ...]] = field(default_factory=dict)


_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_MAIN = re.compile(rf"[ \t]*({_TOKEN}(?:/{_TOKEN})?)[ \t]*")
_PARAM = re.compile(rf'[ \t]*;[ \t]*({_TOKEN})[ \t]*=[ \t]*("(?:[^"\\]|\\.)*"|{_TOKEN})[ \t]*')
_TAIL = re.compile(r"[ \t;]*")
_HEADER_NAME = re.compile(_TOKEN)
_BOUNDARY = re.compile(r"[0-9A-Za-z'()+_,\-./:=? ]{0,69}[0-9A-Za-z'()+_,\-./:=?]")
_SINGLE_FIELDS = ("model", "language", "prompt", "response_format", "temperature", "stream")
_LIST_FIELDS = ("timestamp_granularities[]", "timestamp_granularities")


def parse_audio_form(raw: bytes, content_type: str, *, max_fields: int = 32) -> AudioForm:
    """The form of an audio request, refused whole if any part is doubtful: the router must
    read the same fields, and the same file, as the engine it forwards them to."""
    kind, params = _header_params(content_type, "Content-Type")
    if kind != "multipart/form-data":
        raise AudioError("the request body must be multipart/form-data")
    boundary = params.get("boundary", "")
    if not _BOUNDARY.fullmatch(boundary):
        raise AudioError("missing or invalid multipart boundary in the Content-Type")
    fields: dict[str, list[str]] = {}
    upload: tuple[bytes, str | None, str | None] | None = None
    for name, filename, part_type, start, end in _parts(raw, boundary.encode(), max_fields):
        if name == "file":
            if upload is not None or filename is None:  # engines read a part with no filename
                raise AudioError("field 'file' must be one upload with a filename", "file")
            upload = (raw[start:end], filename, part_type)
        else:
            fields.setdefault(name, []).append(_text(name, raw[start:end]))
    if upload is None or not upload[0]:
        raise AudioError("missing or empty field 'file'", "file")
    return _form(fields, upload)


def _form(fields: dict[str, list[str]], upload: tuple[bytes, str | None, str | None]) -> AudioForm:
    """The known fields typed and checked; a field OpenAI's API takes once must come once."""
    twice = next((name for name in _SINGLE_FIELDS if len(fields.get(name, ())) > 1), None)
    if twice is not None:
        raise AudioError(f"duplicated field {twice!r}", twice)
    one: dict[str, Any] = {name: fields.pop(name)[0] for name in _SINGLE_FIELDS if name in fields}
    if not one.get("model", "").strip():
        raise AudioError("missing or empty field 'model'", "model")
    stream = one.pop("stream", "false").strip().lower()
    if stream not in ("true", "1", "false", "0"):
        raise AudioError("field 'stream' must be true or false", "stream")
    data, filename, part_type = upload
    granularities = tuple(v for name in _LIST_FIELDS for v in fields.pop(name, []))
    return AudioForm(
        file=data,
        filename=filename,
        file_content_type=part_type,
        temperature=_temperature(one.pop("temperature", None)),
        stream=stream in ("true", "1"),
        timestamp_granularities=granularities,
        extra={name: tuple(values) for name, values in fields.items()},
        **one,  # model, language, prompt, response_format
    )


def _header_params(value: str, what: str) -> tuple[str, dict[str, str]]:
    """A header's main value and `; key=value` parameters (lower-cased, unquoted), once each."""
    main = _MAIN.match(value)
    if main is None:
        raise AudioError(f"missing or malformed {what} header")
    params: dict[str, str] = {}
    pos = main.end()
    while not _TAIL.fullmatch(value, pos):
        match = _PARAM.match(value, pos)
        if match is None:
            raise AudioError(f"missing or malformed {what} header")
        key, text = match.group(1).lower(), match.group(2)
        if key in params:
            raise AudioError(f"parameter {key!r} given twice in the {what} header")
        params[key] = re.sub(r"\\(.)", r"\1", text[1:-1]) if text[0] == '"' else text
        pos = match.end()
    return main.group(1).lower(), params


def _parts(
    raw: bytes, boundary: bytes, max_fields: int
) -> Iterator[tuple[str, str | None, str | None, int, int]]:
    """Each part's name, filename, content type and content span, in one pass over `raw`."""
    dash = b"--" + boundary
    delimiter = b"\r\n" + dash
    if not raw.startswith(dash + b"\r\n"):
        raise AudioError("the body does not start with the multipart boundary line")
    pos, count = len(dash) + 2, 0
    while True:
        count += 1
        if count > max_fields:
            raise AudioError(f"the form has more than {max_fields} parts")
        name, filename, part_type, content = _part(raw, pos)
        end = _next_delimiter(raw, delimiter, content)  # from the content on, as engines read
        yield name, filename, part_type, content, end
        pos = end + len(delimiter)
        if raw.startswith(b"--", pos):
            return  # the close delimiter: an epilogue after it is ignored, as RFC 2046 says
        pos += 2  # CRLF, which _next_delimiter checked


def _next_delimiter(raw: bytes, delimiter: bytes, pos: int) -> int:
    """Where the part at `pos` ends: the next CRLF--boundary followed by CRLF or `--`; followed
    by anything else it is content, as python-multipart (the engines' parser) reads it."""
    while True:
        at = raw.find(delimiter, pos)
        if at < 0:
            raise AudioError("the body ends before the closing multipart boundary")
        after = at + len(delimiter)
        if raw.startswith((b"\r\n", b"--"), after):
            return at
        pos = at + 1


def _part(raw: bytes, start: int) -> tuple[str, str | None, str | None, int]:
    """A part's headers, which must name a form-data field, and where its content starts."""
    split = raw.find(b"\r\n\r\n", start, start + _PART_HEADER_LIMIT)
    if split < 0:
        raise AudioError("a multipart part lacks its headers or the blank line after them")
    try:
        lines = raw[start:split].decode("utf-8").split("\r\n")
    except UnicodeDecodeError:
        raise AudioError("multipart part headers are not UTF-8") from None
    headers: dict[str, str] = {}
    for line in lines:
        name, colon, value = line.partition(":")
        if not colon or not _HEADER_NAME.fullmatch(name) or "\r" in value or "\n" in value:
            raise AudioError("malformed multipart part header line")
        if name.lower() in headers:
            raise AudioError(f"multipart part header {name!r} given twice")
        headers[name.lower()] = value.strip(" \t")
    kind, params = _header_params(headers.get("content-disposition", ""), "Content-Disposition")
    name = params.get("name")
    if kind != "form-data" or not name:
        raise AudioError("a multipart part is not a named form-data field")
    return name, params.get("filename"), headers.get("content-type") or None, split + 4


def _text(name: str, content: bytes) -> str:
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError:
        raise AudioError(f"field {name[:64]!r} is not UTF-8 text", name) from None


def _temperature(value: str | None) -> float | None:
    if value is None:
        return None
    with contextlib.suppress(ValueError):
        if math.isfinite(number := float(value)) and number >= 0:
            return number
    raise AudioError("field 'temperature' must be a number of at least 0", "temperature")
