"""Audio metered as its decoder plays it (issue 42 finding 5). The router meters an upload
by its container's header before an engine decodes a byte; a header that lies was metered
20 to 1,000 times short: a µ-law WAV declaring 1,000 times its byte rate held 393 s and was
metered 0.393 s; a VBR MP3 without a Xing header, metered at its first frame's bitrate,
held 6,291 s and was metered 315 s. Now a WAV's length comes from its frames (a byte rate
that disagrees is refused), an MP3's from its frames counted, and the charge settles on the
seconds the engine reports transcribing."""

from __future__ import annotations

import struct

import aiohttp
import pytest
from gpuroute.router.front.parse import audio_charge
from support.fake_engine_app import audio_form
from support.live import MODEL, FakeEngineProcess, async_wait_for, counter, holds, router_server
from support_security import KEY, keys_section, secure_toml

pytestmark = pytest.mark.asyncio

AUTH = {"Authorization": f"Bearer {KEY}"}
TRANSCRIBE = "/v1/audio/transcriptions"


def mulaw_wav(seconds: int, *, byte_rate_times: int = 1) -> bytes:
    """A µ-law WAV (format tag 7) of silence, 8 kHz mono: a byte a sample."""
    data = b"\xff" * (8000 * seconds)
    fmt = struct.pack("<HHIIHH", 7, 1, 8000, 8000 * byte_rate_times, 1, 8)
    chunks = b"fmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", len(data))
    return b"RIFF" + struct.pack("<I", 4 + len(chunks) + len(data)) + b"WAVE" + chunks + data


def mp3_frame(b2: int) -> bytes:
    """An MPEG-2 layer III frame at 22.05 kHz (576 samples) of bitrate index `b2 >> 4`:
    72 × bitrate / rate bytes, zeros after its header."""
    kbps = (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160)[(b2 >> 4) - 1]
    return bytes([0xFF, 0xF3, b2, 0xC0]).ljust(72 * kbps * 1000 // 22050, b"\0")


def vbr_mp3_without_xing(frames: int) -> tuple[bytes, float]:
    """A first frame at 160 kbps, then `frames` at 8 kbps, no VBR header: (file, seconds)."""
    data = mp3_frame(0xE0) + mp3_frame(0x10) * frames
    return data, (frames + 1) * 576 / 22050


@pytest.fixture(scope="module")
def engine():
    fake = FakeEngineProcess("H100", time_scale=0.001)
    yield fake
    fake.stop()


async def transcribe(s: aiohttp.ClientSession, url: str, audio: bytes, name: str):
    form = audio_form(None, model=MODEL)
    form.add_field("file", audio, filename=name, content_type="application/octet-stream")
    async with s.post(url + TRANSCRIBE, data=form, headers=AUTH) as r:
        return r.status, await r.json()


async def test_a_mulaw_wav_is_metered_at_its_samples_and_a_lying_byte_rate_refused(
    tmp_path, engine
) -> None:
    text = secure_toml(engine.url, auth=keys_section())
    async with router_server(text, tmp_path) as server, aiohttp.ClientSession() as s:
        url, app = f"http://127.0.0.1:{server.port}", server.servable
        status, answer = await transcribe(s, url, mulaw_wav(393, byte_rate_times=1000), "a.wav")
        assert status == 400, answer  # was 200, metered 0.393 s
        assert answer["error"]["param"] == "file" and "byte rate" in answer["error"]["message"]
        assert counter(app, "gpuroute_audio_seconds", tenant="acme") == 0
        status, answer = await transcribe(s, url, mulaw_wav(393), "b.wav")
        assert status == 200, answer
        assert answer["usage"] == {"type": "duration", "seconds": 393}  # the engine's count
        assert counter(app, "gpuroute_audio_seconds", tenant="acme") == 393.0


async def test_a_vbr_mp3_without_a_xing_header_is_metered_by_its_frames(tmp_path, engine) -> None:
    text = secure_toml(engine.url, auth=keys_section())
    data, seconds = vbr_mp3_without_xing(40_000)  # 1 MB, 1,045 s: 50 s at 160 kbps
    async with router_server(text, tmp_path) as server, aiohttp.ClientSession() as s:
        url, app = f"http://127.0.0.1:{server.port}", server.servable
        await transcribe(s, url, data, "speech.mp3")  # (the fake engine decodes WAV only)
        metered = counter(app, "gpuroute_audio_seconds", tenant="acme")
    assert metered == pytest.approx(seconds), (metered, len(data) * 8 / 160_000)


async def test_the_charge_settles_on_the_seconds_the_engine_reports(tmp_path, engine) -> None:
    """A 2.5-s upload is charged at 2.5 s; vLLM reports whole seconds transcribed (3): the
    quota settles the difference, as token usage settles a chat's charge."""
    text = secure_toml(engine.url, auth=keys_section("tokens_per_minute = 100000"))
    wav = mulaw_wav(5)[: 44 + 20000]  # cut at 2.5 s: the data chunk says 5, holds 2.5
    async with router_server(text, tmp_path) as server, aiohttp.ClientSession() as s:
        url, app = f"http://127.0.0.1:{server.port}", server.servable
        status, answer = await transcribe(s, url, wav, "cut.wav")
        assert (status, answer["usage"]) == (200, {"type": "duration", "seconds": 3}), answer
        debt = audio_charge(3) - audio_charge(2.5)
        settled = {"tenant": "acme", "direction": "debt"}
        await async_wait_for(
            holds(lambda: counter(app, "gpuroute_quota_settled_tokens", **settled) == debt),
            what="the charge settled on the engine's 3 s",
        )
