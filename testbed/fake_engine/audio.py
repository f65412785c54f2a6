"""The fake engine's speech-to-text routes, shaped as vLLM 0.32 answers them for a Whisper
model (entrypoints/speech_to_text/: transcription/ and translation/ api_router.py and
protocol.py, base/serving.py); a real vLLM serving a text-only model answers both 404.

`POST /v1/audio/transcriptions` and `/v1/audio/translations` take multipart/form-data:
`file` (required), `model`, `language`, `response_format`, `stream`,
`stream_include_usage`, `max_completion_tokens`. The fake reads only WAV files (RIFF/WAVE:
any codec whose `fmt ` chunk gives a byte rate, PCM or float, mono or not): the duration is
the `data` chunk's length in frames, as decoders count them (`wav_duration`); anything
else gets vLLM's 400 "Invalid or unsupported audio file." (vLLM itself decodes mp3, flac,
ogg, m4a, webm and others too).

Answers, as vLLM's: json and text both give JSON (`{"text", "usage": {"type":
"duration", "seconds": ceil(duration)}}` for a transcription, `{"text"}` for a
translation: vLLM reports no usage there); verbose_json gives `duration`, `language`,
`text` and `segments` (one per 30-s window); srt and vtt are refused (400); a stream sends
`transcription.chunk` / `translation.chunk` events and `data: [DONE]`.

Pacing: vLLM cuts audio longer than Whisper's 30-s window into windows, one engine request
each; so does the fake, each window a prefill of AUDIO_TOKENS_PER_S tokens a second (the
encoder's 50 frames a second) and a transcript of SPOKEN_TOKENS_PER_S tokens a second."""

from __future__ import annotations

import asyncio
import math
import os
import struct
import time
from typing import Any

from aiohttp import web
from gpuroute.testbed.fake_engine.common import (
    ServingEngine,
    finish_all,
    hex_id,
    hung_up,
    open_stream,
    submit_all,
    unknown_model,
)
from gpuroute.testbed.fake_engine.payloads import tokens_text

from gpuroute.openai_api import SSE_DONE, error_response, sse_event

AUDIO_TOKENS_PER_S = 50  # Whisper's encoder frames: 1,500 per 30-s window
SPOKEN_TOKENS_PER_S = 3  # ~2.5 words a second of speech
WINDOW_S = 30.0  # Whisper's max_audio_clip_s: longer audio runs as several requests
FORMATS = ("json", "text", "verbose_json")
REFUSED_FORMATS = ("srt", "vtt", "diarized_json")  # valid names vLLM refuses for Whisper
BAD_AUDIO = "Invalid or unsupported audio file."


def wav_duration(data: bytes) -> float:
    """Seconds of audio in a WAV file, as a decoder plays it (libsndfile, which vLLM's
    audio loader uses): linear samples (PCM, float, A-law, µ-law, EXTENSIBLE) in frames of
    channels × bytes a sample, from the bits per sample (the byte rate and the block size
    are not read); other codecs at their byte rate; ValueError if it is not one."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise ValueError("not a RIFF/WAVE file")
    pos, per_second = 12, 0
    while pos + 8 <= len(data):
        kind, size = data[pos : pos + 4], int.from_bytes(data[pos + 4 : pos + 8], "little")
        start = pos + 8
        if kind == b"fmt ":
            if size < 16 or start + 16 > len(data):
                raise ValueError("short fmt chunk")
            tag, channels, rate, byte_rate, _align, bits = struct.unpack_from(
                "<HHIIHH", data, start
            )
            if not channels or not rate or not byte_rate:
                raise ValueError("fmt chunk without a rate")
            per_second = byte_rate
            if tag in (1, 3, 6, 7, 0xFFFE) and bits:
                per_second = rate * channels * (1 if tag in (6, 7) else (bits + 7) // 8)
        elif kind == b"data":
            if not per_second:
                raise ValueError("data chunk before the fmt chunk")
            # a streamed WAV leaves the size 0xFFFFFFFF; a cut one says more than it holds
            return min(size, len(data) - start) / per_second
        pos = start + size + (size & 1)  # chunks are padded to an even length
    raise ValueError("no data chunk")


def windows(duration: float) -> list[float]:
    """The 30-s windows vLLM cuts the audio into, in seconds each."""
    count = max(1, math.ceil(duration / WINDOW_S))
    return [min(WINDOW_S, duration - i * WINDOW_S) for i in range(count)]


def flag(value: str | None) -> bool:
    """A form field read as a boolean, as pydantic reads one."""
    return value is not None and value.strip().lower() in ("true", "1", "yes", "on", "t", "y")


def _env_limit(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


class FakeAudio:
    def __init__(self, engine: ServingEngine) -> None:
        self.engine = engine
        self.max_bytes = _env_limit("VLLM_MAX_AUDIO_CLIP_FILESIZE_MB", 25) * 1024 * 1024
        self.max_seconds = _env_limit("VLLM_MAX_AUDIO_DECODE_DURATION_S", 600)

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/audio/transcriptions", self.transcriptions),
            web.post("/v1/audio/translations", self.translations),
        ]

    async def transcriptions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "transcribe")

    async def translations(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "translate")

    async def _form(self, request: web.Request) -> dict[str, Any] | web.Response:
        """The form's fields and the file's duration, or the error vLLM answers."""
        engine = self.engine
        await engine.faults.resumed.wait()  # as FakeEngine.admit: hang, then error_rate
        if engine.faults.error_rate and engine.rng.random() < engine.faults.error_rate:
            engine.errors_injected += 1
            return error_response(500, "injected error", code="fault_error_rate")
        form = await request.post() if request.content_type.startswith("multipart/") else {}
        upload = form.get("file")
        if not isinstance(upload, web.FileField):
            return error_response(400, "Field required: 'file' (a multipart file)", param="file")
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
        model = fields.get("model")
        if model and model != engine.name:
            return unknown_model(model)
        data = upload.file.read()
        if len(data) > self.max_bytes:
            return error_response(400, "Maximum file size exceeded", param="audio_filesize_mb")
        try:
            duration = wav_duration(data)
        except ValueError:
            return error_response(400, BAD_AUDIO)
        if duration > self.max_seconds:
            message = f"Audio exceeds maximum allowed duration of {self.max_seconds:g}s"
            return error_response(400, message)
        return fields | {"duration": duration}

    def _check(self, form: dict[str, Any]) -> web.Response | None:
        fmt, stream = form.get("response_format", "json"), flag(form.get("stream"))
        if fmt in REFUSED_FORMATS:
            return error_response(
                400, "Currently only support response_format: `text`, `json`, "
                "`verbose_json` or `diarized_json`" if fmt != "diarized_json"
                else f"Currently do not support diarized_json for {self.engine.name}",
            )  # fmt: skip
        if fmt not in FORMATS:
            return error_response(400, f"unknown response_format {fmt!r}", param="response_format")
        if stream and fmt == "verbose_json":
            return error_response(400, "verbose_json format doesn't support streaming case")
        cap = form.get("max_completion_tokens")
        if cap is not None and not cap.isdigit():
            return error_response(400, "'max_completion_tokens' must be an integer",
                                  param="max_completion_tokens")  # fmt: skip
        return None

    async def _serve(self, request: web.Request, task: str) -> web.StreamResponse:
        form = await self._form(request)
        if isinstance(form, web.Response):
            return form
        if refused := self._check(form):
            return refused
        cap = int(form["max_completion_tokens"]) if "max_completion_tokens" in form else None
        jobs, finishes = [], []
        for seconds in windows(form["duration"]):
            spoken = max(1, math.ceil(seconds * SPOKEN_TOKENS_PER_S))
            cut = cap is not None and 0 < cap <= spoken
            jobs.append((max(1, math.ceil(seconds * AUDIO_TOKENS_PER_S)),
                         cap if cut else spoken, ()))  # fmt: skip
            finishes.append("length" if cut else "stop")
        lives = submit_all(self.engine, jobs)
        if isinstance(lives, web.Response):
            return lives
        if flag(form.get("stream")):
            return await self._stream(request, task, form, lives, jobs, finishes)
        await finish_all(self.engine, lives, finishes)
        text = " ".join(tokens_text(output).strip() for _, output, _ in jobs)
        return web.json_response(self._answer(task, form, text, [j[1] for j in jobs]))

    def _answer(
        self, task: str, form: dict[str, Any], text: str, outputs: list[int]
    ) -> dict[str, Any]:
        duration = form["duration"]
        if form.get("response_format") == "verbose_json":
            language = form.get("language") or "en"
            return {"duration": duration, "language": language, "text": text,
                    "segments": segments(duration, outputs), "words": None}  # fmt: skip
        if task == "translate":
            return {"text": text}  # vLLM: "no usage in response for translation task"
        return {"text": text, "usage": {"type": "duration", "seconds": math.ceil(duration)}}

    async def _stream(
        self, request: web.Request, task: str, form: dict[str, Any], lives, jobs, finishes
    ) -> web.StreamResponse:
        engine, created = self.engine, int(time.time())
        assert engine.engine is not None
        kind = "transcription.chunk" if task == "transcribe" else "translation.chunk"
        envelope = {"id": hex_id(f"{task}-"), "object": kind, "created": created,
                    "model": engine.name}  # fmt: skip

        def chunk(n: int, finish: str | None = None) -> bytes:
            choice: dict[str, Any] = {"delta": {"content": tokens_text(n)}}
            if finish is not None:
                choice |= {"finish_reason": finish, "stop_reason": None}
            return sse_event(envelope | {"choices": [choice]})

        try:
            response = await open_stream(request)
            for live, (_, output, _), finish in zip(lives, jobs, finishes, strict=True):
                await live.first_token
                await engine.stream_tokens(response, chunk, live, output - 1)
                await asyncio.wait([live.done])
                await response.write(chunk(1, finish))
            if flag(form.get("stream_include_usage")):
                prompt, output = sum(j[0] for j in jobs), sum(j[1] for j in jobs)
                usage = {"prompt_tokens": prompt, "completion_tokens": output,
                         "total_tokens": prompt + output}  # fmt: skip
                await response.write(sse_event(envelope | {"choices": [], "usage": usage}))
            await response.write(SSE_DONE)
            await response.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            hung_up(engine, lives, finishes)  # the client went away
            raise
        for finish in finishes:
            engine.finished[finish] += 1
        return response


def segments(duration: float, outputs: list[int]) -> list[dict[str, Any]]:
    """verbose_json's segments: one per window (TranscriptionSegment's fields)."""
    out = []
    for i, (seconds, output) in enumerate(zip(windows(duration), outputs, strict=True)):
        start = i * WINDOW_S
        out.append({"id": i, "avg_logprob": -0.25, "compression_ratio": 1.2,
                    "end": round(start + seconds, 3), "no_speech_prob": None, "seek": 0,
                    "start": start, "temperature": 0.0, "text": tokens_text(output).strip(),
                    "tokens": list(range(output))})  # fmt: skip
    return out
