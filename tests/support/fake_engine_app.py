"""An in-process fake engine on a loopback port, for tests of its APIs (no child process:
each test gets a fresh engine, its Responses store included)."""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp
from aiohttp.test_utils import TestServer
from gpuroute.testbed.fake_engine.server import FakeEngine, FakeEngineConfig


@dataclass
class LiveFake:
    engine: FakeEngine
    url: str
    session: aiohttp.ClientSession

    async def post(self, path: str, body: dict | bytes | None = None, **kw) -> tuple[int, dict]:
        """(status, JSON answer) of a POST with a JSON body (bytes: sent as they are)."""
        if isinstance(body, bytes):
            kw["data"], kw["headers"] = body, {"Content-Type": "application/json"}
        elif body is not None:
            kw["json"] = body
        async with self.session.post(self.url + path, **kw) as r:
            return r.status, json.loads(await r.read())

    async def get(self, path: str) -> tuple[int, dict]:
        async with self.session.get(self.url + path) as r:
            return r.status, json.loads(await r.read())

    async def raw(self, path: str, **kw) -> tuple[int, str, str]:
        """(status, content type, text) of a POST."""
        async with self.session.post(self.url + path, **kw) as r:
            return r.status, r.content_type, await r.text()

    async def metrics(self) -> dict[str, float]:
        """/metrics as name -> value, summed over label sets."""
        async with self.session.get(self.url + "/metrics") as r:
            text = await r.text()
        values: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                key = name.split("{")[0]
                values[key] = values.get(key, 0.0) + float(value)
        return values


@asynccontextmanager
async def fake_engine_app(gpu: str = "H100", **config) -> AsyncIterator[LiveFake]:
    engine = FakeEngine(FakeEngineConfig(gpu=gpu, **config))
    async with TestServer(engine.app()) as server, aiohttp.ClientSession() as session:
        yield LiveFake(engine, str(server.make_url("")).rstrip("/"), session)


def sse_events(text: str) -> list[tuple[str | None, dict | str]]:
    """Each SSE event as (its `event:` name or None, its data: JSON, or the raw string)."""
    assert text.endswith("\n\n"), "the stream does not end with a blank line"
    events = []
    for block in text.split("\n\n")[:-1]:
        name, data = None, None
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                data = line.removeprefix("data: ")
        assert data is not None, f"an event without data: {block[:200]!r}"
        events.append((name, data if data == "[DONE]" else json.loads(data)))
    return events


def wav(seconds: float, rate: int = 16000, channels: int = 1, bits: int = 16, tag: int = 1,
        extra_chunk: bytes = b"", data_size: int | None = None) -> bytes:  # fmt: skip
    """A WAV file of silence: RIFF, `fmt `, an optional chunk before the data, `data`."""
    align = channels * bits // 8
    data = b"\0" * (int(seconds * rate) * align)
    fmt = struct.pack("<HHIIHH", tag, channels, rate, rate * align, align, bits)
    size = len(data) if data_size is None else data_size
    chunks = b"fmt " + struct.pack("<I", 16) + fmt + extra_chunk
    chunks += b"data" + struct.pack("<I", size) + data
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks


def audio_form(file: bytes | None, **fields: str) -> aiohttp.FormData:
    form = aiohttp.FormData()
    if file is not None:
        form.add_field("file", file, filename="speech.wav", content_type="audio/wav")
    for name, value in fields.items():
        form.add_field(name, value)
    return form
