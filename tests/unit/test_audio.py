"""Audio requests: the multipart form is read as engines read it or refused with the field
at fault, and each container's header gives the exact duration the router meters."""

from __future__ import annotations

import contextlib
import io
import struct
import wave

import httpx2
import openai
import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuroute.audio import AudioError, parse_audio_form
from gpuroute.audio_duration import MAX_DURATION_S, audio_duration_s, reported_seconds

BOUNDARY = "b0undary-1234"
CONTENT_TYPE = f"multipart/form-data; boundary={BOUNDARY}"


def part(name: str, value: bytes | str, *, filename: str | None = None, kind: str = "") -> bytes:
    """One part as httpx and requests write it: headers, a blank line, the content."""
    disposition = f'Content-Disposition: form-data; name="{name}"'
    if filename is not None:
        disposition += f'; filename="{filename}"'
    headers = disposition + (f"\r\nContent-Type: {kind}" if kind else "")
    content = value.encode() if isinstance(value, str) else value
    return headers.encode() + b"\r\n\r\n" + content


def form(*parts: bytes, boundary: str = BOUNDARY) -> bytes:
    """RFC 2046: `--boundary CRLF part` for each part, each one after a CRLF, then the close
    delimiter `CRLF --boundary--`."""
    dash = b"--" + boundary.encode()
    return dash + b"\r\n" + (b"\r\n" + dash + b"\r\n").join(parts) + b"\r\n" + dash + b"--\r\n"


AUDIO = part("file", b"RIFF....WAVE", filename="a.wav", kind="audio/wav")
MODEL = part("model", "whisper-1")


def wav_bytes(rate: int, channels: int, width: int, frames: int) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(width)
        out.setframerate(rate)
        out.writeframes(b"\x01" * (frames * channels * width))
    return buffer.getvalue()


# --- the form ---


def test_a_full_form_is_read_with_its_types() -> None:
    body = form(
        MODEL,
        part("language", "en"),
        part("prompt", "Names: Zoë, O'Brien"),
        part("response_format", "verbose_json"),
        part("temperature", "0.25"),
        part("timestamp_granularities[]", "word"),
        part("timestamp_granularities[]", "segment"),
        part("stream", "True"),
        part("chunking_strategy", "auto"),
        part("include[]", "logprobs"),
        part("include[]", "other"),
        AUDIO,
    )
    parsed = parse_audio_form(body, CONTENT_TYPE)
    assert (parsed.model, parsed.file, parsed.filename) == ("whisper-1", b"RIFF....WAVE", "a.wav")
    assert parsed.file_content_type == "audio/wav"
    assert (parsed.language, parsed.prompt) == ("en", "Names: Zoë, O'Brien")
    assert (parsed.response_format, parsed.temperature, parsed.stream) == (
        "verbose_json",
        0.25,
        True,
    )
    assert parsed.timestamp_granularities == ("word", "segment")
    assert parsed.extra == {"chunking_strategy": ("auto",), "include[]": ("logprobs", "other")}


def test_defaults_when_only_model_and_file_are_sent() -> None:
    parsed = parse_audio_form(form(MODEL, part("file", b"x", filename="")), CONTENT_TYPE)
    assert (parsed.filename, parsed.file_content_type, parsed.language) == ("", None, None)
    assert (parsed.temperature, parsed.stream, parsed.timestamp_granularities) == (None, False, ())


def test_the_content_type_header_is_read_leniently_where_rfcs_allow() -> None:
    body = form(MODEL, AUDIO, boundary="with space'()+_,-./:=?")
    header = 'Multipart/Form-Data ; charset=utf-8; BOUNDARY="with space\'()+_,-./:=?";'
    assert parse_audio_form(body, header).model == "whisper-1"


def test_crlf_belongs_to_the_delimiter_and_content_keeps_its_own() -> None:
    """The CRLF before each delimiter is not content; CRLFs inside content are kept."""
    data = b"\r\nline\r\n\r\n"
    parsed = parse_audio_form(form(MODEL, part("file", data, filename="f")), CONTENT_TYPE)
    assert parsed.file == data


def test_boundary_like_text_inside_a_field_is_content() -> None:
    """`--boundary` not after a CRLF, or after one but followed by more than CRLF or `--`, is
    not a delimiter (RFC 2046; python-multipart reads it the same)."""
    tricky = f"--{BOUNDARY}\r\n--{BOUNDARY}X\r\n--{BOUNDARY} \r\n--{BOUNDARY}-x"
    parsed = parse_audio_form(form(MODEL, part("prompt", tricky), AUDIO), CONTENT_TYPE)
    assert parsed.prompt == tricky


def test_an_epilogue_after_the_close_delimiter_is_ignored() -> None:
    parsed = parse_audio_form(form(MODEL, AUDIO) + b"trailing words", CONTENT_TYPE)
    assert parsed.model == "whisper-1"


def test_a_form_built_by_requests_parses() -> None:
    prepared = requests.Request(
        "POST",
        "http://router/v1/audio/transcriptions",
        data={"model": "whisper-1", "language": "de"},
        files={"file": ("speech.mp3", b"ID3\x03\x00\x00\x00\x00\x00\x00", "audio/mpeg")},
    ).prepare()
    assert isinstance(prepared.body, bytes)
    parsed = parse_audio_form(prepared.body, prepared.headers["Content-Type"])
    assert (parsed.model, parsed.language, parsed.filename) == ("whisper-1", "de", "speech.mp3")
    assert parsed.file_content_type == "audio/mpeg"


def test_the_openai_clients_body_parses_and_its_audio_is_timed() -> None:
    captured: dict[str, bytes | str] = {}

    def engine(request: httpx2.Request) -> httpx2.Response:
        captured["type"], captured["body"] = request.headers["content-type"], request.read()
        return httpx2.Response(200, json={"text": "hello"})

    transport = httpx2.MockTransport(engine)
    client = openai.OpenAI(
        api_key="k", base_url="http://router/v1", http_client=httpx2.Client(transport=transport)
    )
    audio = wav_bytes(16000, 1, 2, 24000)  # 24,000 frames at 16 kHz: 1.5 s
    client.audio.transcriptions.create(
        file=("clip.wav", audio, "audio/wav"),
        model="whisper-large-v3",
        temperature=0.0,
        timestamp_granularities=["segment"],
    )
    body, content_type = captured["body"], captured["type"]
    assert isinstance(body, bytes) and isinstance(content_type, str)
    parsed = parse_audio_form(body, content_type)
    assert (parsed.model, parsed.filename, parsed.file) == ("whisper-large-v3", "clip.wav", audio)
    assert (parsed.temperature, parsed.timestamp_granularities) == (0.0, ("segment",))
    assert audio_duration_s(parsed.file, parsed.filename, parsed.file_content_type) == 1.5


REFUSED = [
    # (body, content type, param)
    (form(MODEL, AUDIO), "application/json", None),
    (form(MODEL, AUDIO), "multipart/form-data", None),
    (form(MODEL, AUDIO), "multipart/form-data; boundary=", None),
    (form(MODEL, AUDIO), "multipart/form-data; boundary=" + "x" * 71, None),
    (form(MODEL, AUDIO), 'multipart/form-data; boundary="trailing "', None),
    (form(MODEL, AUDIO), "multipart/form-data; boundary=a; boundary=b", None),
    (form(MODEL, AUDIO), 'multipart/form-data; boundary="unterminated', None),
    (b"preamble\r\n" + form(MODEL, AUDIO), CONTENT_TYPE, None),
    (form(MODEL, AUDIO).replace(b"\r\n", b"\n"), CONTENT_TYPE, None),  # bare LF
    (form(MODEL, AUDIO)[:-4], CONTENT_TYPE, None),  # no close delimiter
    (form(MODEL, b"no blank line after headers"), CONTENT_TYPE, None),
    (form(MODEL, b"Content-Type: text/plain\r\n\r\nx"), CONTENT_TYPE, None),  # no disposition
    (form(MODEL, b'Content-Disposition: attachment; name="a"\r\n\r\nx'), CONTENT_TYPE, None),
    (form(MODEL, b"Content-Disposition: form-data\r\n\r\nx"), CONTENT_TYPE, None),  # no name
    (
        form(MODEL, b'Content-Disposition: form-data; name="a"\r\nNoColon\r\n\r\nx'),
        CONTENT_TYPE,
        None,
    ),
    (
        form(MODEL, b'Content-Disposition: form-data; name="a"\r\n folded\r\n\r\nx'),
        CONTENT_TYPE,
        None,
    ),
    (
        form(MODEL, part("a", "x").replace(b"\r\n\r\n", b"\r\nContent-Disposition: x\r\n\r\n")),
        CONTENT_TYPE,
        None,
    ),
    (form(MODEL, b'Content-Disposition: form-data; name="\xff"\r\n\r\nx'), CONTENT_TYPE, None),
    (form(MODEL, MODEL.replace(b'"model"', b'"model"; name="x"')), CONTENT_TYPE, None),
    (form(MODEL, AUDIO, *[part(f"f{i}", "x") for i in range(31)]), CONTENT_TYPE, None),
    (form(AUDIO), CONTENT_TYPE, "model"),
    (form(part("model", "  "), AUDIO), CONTENT_TYPE, "model"),
    (form(MODEL, MODEL, AUDIO), CONTENT_TYPE, "model"),
    (form(MODEL), CONTENT_TYPE, "file"),
    (form(MODEL, part("file", b"", filename="empty.wav")), CONTENT_TYPE, "file"),
    (form(MODEL, AUDIO, AUDIO), CONTENT_TYPE, "file"),
    (form(MODEL, part("file", b"RIFF")), CONTENT_TYPE, "file"),  # a text field to engines
    (form(MODEL, AUDIO, part("language", "en"), part("language", "fr")), CONTENT_TYPE, "language"),
    (form(MODEL, AUDIO, part("prompt", b"caf\xe9")), CONTENT_TYPE, "prompt"),  # Latin-1
    (form(MODEL, AUDIO, part("x-extra", b"\xc3")), CONTENT_TYPE, "x-extra"),
    (form(MODEL, AUDIO, part("temperature", "warm")), CONTENT_TYPE, "temperature"),
    (form(MODEL, AUDIO, part("temperature", "nan")), CONTENT_TYPE, "temperature"),
    (form(MODEL, AUDIO, part("temperature", "-0.5")), CONTENT_TYPE, "temperature"),
    (form(MODEL, AUDIO, part("stream", "yes")), CONTENT_TYPE, "stream"),
]


@pytest.mark.parametrize(("body", "content_type", "param"), REFUSED)
def test_doubtful_forms_are_refused_naming_the_field(
    body: bytes, content_type: str, param: str | None
) -> None:
    with pytest.raises(AudioError) as refused:
        parse_audio_form(body, content_type)
    assert refused.value.param == param and refused.value.message


def test_the_part_limit_counts_every_part() -> None:
    body = form(MODEL, AUDIO, part("language", "en"))
    assert parse_audio_form(body, CONTENT_TYPE, max_fields=3).language == "en"
    with pytest.raises(AudioError, match="more than 2 parts"):
        parse_audio_form(body, CONTENT_TYPE, max_fields=2)


@pytest.mark.timeout(20)
def test_adversarial_bodies_are_read_in_linear_time() -> None:
    """Near-delimiters fill an 8 MiB body: each is looked at once."""
    near = f"\r\n--{BOUNDARY}X".encode() * (8 * 2**20 // (len(BOUNDARY) + 5))
    parsed = parse_audio_form(form(MODEL, part("file", near, filename="f")), CONTENT_TYPE)
    assert parsed.file == near
    params = b"".join(b"; x%d=y" % i for i in range(900))  # under the 8 KiB header limit
    headers = b"Content-Disposition: form-data; name=a" + params + b"\r\n\r\n"
    with pytest.raises(AudioError):
        parse_audio_form(form(MODEL, headers), CONTENT_TYPE)


VALID = form(MODEL, part("language", "en"), AUDIO)
FORM_PIECES = [b"\r\n", b"--", BOUNDARY.encode(), b'"', b";", b":", b"=", b"name", b"file", b"\xff"]
form_bodies = st.one_of(
    st.binary(max_size=2048),
    st.builds(
        lambda cut, tail: VALID[:cut] + tail, st.integers(0, len(VALID)), st.binary(max_size=64)
    ),
    st.lists(st.sampled_from(FORM_PIECES), max_size=40).map(b"".join),
)
content_types = st.sampled_from([CONTENT_TYPE, "multipart/form-data; boundary=x", "text/plain", ""])


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(form_bodies, content_types)
def test_arbitrary_bytes_give_a_form_or_an_audio_error(body: bytes, content_type: str) -> None:
    try:
        parse_audio_form(body, content_type, max_fields=8)
    except AudioError as refused:
        assert refused.message


@settings(max_examples=200)
@given(st.text(max_size=200))
def test_arbitrary_content_types_give_an_audio_error_at_worst(content_type: str) -> None:
    with contextlib.suppress(AudioError):
        parse_audio_form(VALID, content_type)


# --- durations ---


def riff(*chunks: tuple[bytes, bytes]) -> bytes:
    """RIFF/WAVE: "RIFF", the size of what follows, "WAVE", then chunks of a 4-byte id, a
    32-bit little-endian size and the data, padded to an even length."""
    body = b"".join(
        name + struct.pack("<I", len(data)) + data + b"\0" * (len(data) & 1)
        for name, data in chunks
    )
    return b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WAVE" + body


def pcm_fmt(tag: int, channels: int, rate: int, byte_rate: int, align: int, bits: int) -> bytes:
    """The fmt chunk's first 16 bytes: format tag, channels, sample rate, byte rate, block
    align, bits per sample."""
    return struct.pack("<HHIIHH", tag, channels, rate, byte_rate, align, bits)


PCM_GUID = bytes.fromhex("0100000000001000800000aa00389b71")


@pytest.mark.parametrize(
    ("rate", "channels", "width", "frames", "seconds"),
    [(16000, 1, 2, 24000, 1.5), (44100, 2, 1, 22050, 0.5), (8000, 2, 3, 12000, 1.5)],
)
def test_wav_from_the_wave_module(
    rate: int, channels: int, width: int, frames: int, seconds: float
) -> None:
    assert audio_duration_s(wav_bytes(rate, channels, width, frames)) == seconds


def test_wav_extensible_with_a_padded_chunk_before_its_data() -> None:
    # 48 kHz stereo, 24-bit samples in 32-bit containers: 8 bytes a frame, 384,000 a second;
    # the extension: its size (22), valid bits, channel mask, sub-format GUID (PCM)
    fmt = pcm_fmt(0xFFFE, 2, 48000, 384000, 8, 32) + struct.pack("<HHI", 22, 24, 3) + PCM_GUID
    data = riff((b"fmt ", fmt), (b"LIST", b"odd"), (b"data", b"\0" * 96000))
    assert audio_duration_s(data) == 0.25  # 96,000 / 384,000


def test_wav_sizes_written_by_streaming_encoders_and_short_files() -> None:
    fmt = (b"fmt ", pcm_fmt(1, 1, 8000, 16000, 2, 16))  # 8 kHz mono 16-bit: 16,000 bytes/s
    streamed = riff(fmt) + b"data" + struct.pack("<I", 0xFFFFFFFF) + b"\0" * 4000
    assert audio_duration_s(streamed) == 0.25  # the bytes present
    short = riff(fmt) + b"data" + struct.pack("<I", 32000) + b"\0" * 8000
    assert audio_duration_s(short) == 0.5  # what an engine can decode, not what was declared


# fmt chunks as encoders write them: (tag, channels, rate, byte rate, block align, bits),
# then for ADPCM cbSize and the samples a block; (bytes of data, seconds)
CODECS = [
    (pcm_fmt(7, 1, 8000, 8000, 1, 8), 8000 * 393, 393.0),  # µ-law, as telephony writes it
    (pcm_fmt(6, 2, 8000, 16000, 2, 8), 32000, 2.0),  # A-law stereo
    (pcm_fmt(3, 1, 16000, 64000, 4, 32), 32000, 0.5),  # IEEE float 32
    (pcm_fmt(3, 2, 48000, 768000, 16, 64), 76800, 0.1),  # IEEE float 64, stereo
    # IMA ADPCM, mono, 256-byte blocks: 4 header bytes and 504 4-bit codes, 505 samples
    (pcm_fmt(0x11, 1, 8000, 4055, 256, 4) + struct.pack("<HH", 2, 505), 256 * 16, 1.01),
    # Microsoft ADPCM, stereo, 1,024-byte blocks: 14 header bytes, (1024 - 14) × 2 / 2 + 2
    (pcm_fmt(2, 2, 22050, 22311, 1024, 4) + struct.pack("<HH", 32, 1012), 1024 * 10, 0.4589),
    (pcm_fmt(0x31, 1, 8000, 1625, 65, 0) + struct.pack("<HH", 2, 320), 65 * 25, 1.0),  # GSM
]


@pytest.mark.parametrize(("fmt", "size", "seconds"), CODECS)
def test_every_metered_wav_codec_counts_frames_or_blocks(fmt: bytes, size: int, seconds: float):
    data = riff((b"fmt ", fmt), (b"data", b"\0" * size))
    assert audio_duration_s(data) == pytest.approx(seconds, abs=1e-4)


def test_wav_extensible_names_its_codec_in_the_guid() -> None:
    mulaw = struct.pack("<H", 7) + PCM_GUID[2:]
    fmt = pcm_fmt(0xFFFE, 1, 8000, 8000, 1, 8) + struct.pack("<HHI", 22, 8, 4) + mulaw
    assert audio_duration_s(riff((b"fmt ", fmt), (b"data", b"\0" * 4000))) == 0.5
    foreign = pcm_fmt(0xFFFE, 1, 8000, 8000, 1, 8) + struct.pack("<HHI", 22, 8, 4) + b"\1" * 16
    with pytest.raises(AudioError, match="sub-format"):
        audio_duration_s(riff((b"fmt ", foreign), (b"data", b"\0" * 4000)))


LIES = [
    # issue 42 finding 5: µ-law declaring 1,000 times its byte rate (metered 0.393 s of 393)
    pcm_fmt(7, 1, 8000, 8_000_000, 1, 8),
    pcm_fmt(7, 1, 8000, 8_000_000, 1000, 8),  # its block size too: the rate agrees with it
    pcm_fmt(1, 1, 8000, 16_000_000, 2000, 16),  # PCM whose frames are not 2 bytes
    pcm_fmt(3, 1, 16000, 64000 * 100, 400, 32),  # float, the same
    pcm_fmt(1, 1, 8000, 16000, 2, 0),  # no bits per sample
    pcm_fmt(0x11, 1, 8000, 4055, 256, 4) + struct.pack("<HH", 2, 50500),  # samples a block
    pcm_fmt(0x11, 1, 8000, 4055, 4, 4) + struct.pack("<HH", 2, 1),  # no room for codes
    pcm_fmt(2, 3, 8000, 4055, 1024, 4) + struct.pack("<HH", 32, 340),  # MS ADPCM, 3 channels
    pcm_fmt(0x31, 2, 8000, 3250, 130, 0),  # GSM in stereo
    pcm_fmt(0x55, 2, 44100, 16000, 1, 0) + struct.pack("<H", 0),  # MP3 in WAV: no counts
    pcm_fmt(0x0161, 2, 44100, 16000, 2230, 16),  # WMA: the same
    pcm_fmt(1, 0, 8000, 0, 0, 16),  # no channels
]


@pytest.mark.parametrize("fmt", LIES)
def test_wav_headers_that_cannot_be_checked_or_do_not_agree_are_refused(fmt: bytes) -> None:
    with pytest.raises(AudioError) as refused:
        audio_duration_s(riff((b"fmt ", fmt), (b"data", b"\0" * 8000)))
    assert refused.value.param == "file" and refused.value.message


def flac(rate: int, channels: int, bits: int, total: int, block_type: int = 0) -> bytes:
    """ "fLaC", then STREAMINFO: a header byte (last-block flag, type 0) and a 24-bit length
    of 34; min and max block size (16 bits each), min and max frame size (24 bits each); 64
    bits packing sample rate (20), channels − 1 (3), bits − 1 (5) and total samples (36);
    the audio's MD5 (16 bytes)."""
    packed = rate << 44 | (channels - 1) << 41 | (bits - 1) << 36 | total
    info = struct.pack(">HH6xQ16x", 4096, 4096, packed)
    return b"fLaC" + bytes([0x80 | block_type]) + (34).to_bytes(3, "big") + info


def id3(size: int) -> bytes:
    """An ID3v2.4 tag: "ID3", version 4.0, flags, the size in 4 syncsafe bytes (7 bits each)."""
    syncsafe = bytes((size >> shift) & 0x7F for shift in (21, 14, 7, 0))
    return b"ID3\x04\x00\x00" + syncsafe + b"\0" * size


def test_flac_streaminfo() -> None:
    assert audio_duration_s(flac(44100, 2, 16, 441000)) == 10.0
    assert audio_duration_s(id3(300) + flac(96000, 1, 24, 144000)) == 1.5
    for broken in (flac(44100, 2, 16, 0), flac(0, 2, 16, 10), flac(44100, 2, 16, 1, 4)):
        with pytest.raises(AudioError):
            audio_duration_s(broken)


def mp3(b1: int, b2: int, b3: int, after_header: bytes, size: int) -> bytes:
    """A frame header (sync 0xFF, then version, layer and CRC bits; bitrate, sample rate and
    padding; channel mode) and what follows it, zero-filled to `size` bytes."""
    frame = bytes([0xFF, b1, b2, b3]) + after_header
    return frame + b"\0" * (size - len(frame))


def frame_size(b1: int, b2: int) -> int:
    """A frame's bytes (ISO 11172-3 / 13818-3): layer I 12 × bitrate / rate 4-byte slots,
    layer II and MPEG-1 layer III 144 × bitrate / rate bytes, MPEG-2/2.5 layer III 72 ×."""
    version, layer, index, rate_index = b1 >> 3 & 3, 4 - (b1 >> 1 & 3), b2 >> 4, b2 >> 2 & 3
    rate = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}[version][
        rate_index
    ]
    kbps = KBPS[version == 3, layer if version == 3 else min(layer, 2)][index - 1]
    pad = b2 >> 1 & 1
    if layer == 1:
        return (12 * kbps * 1000 // rate + pad) * 4
    return (72 if layer == 3 and version != 3 else 144) * kbps * 1000 // rate + pad


KBPS = {
    (True, 1): (32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448),
    (True, 2): (32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384),
    (True, 3): (32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    (False, 1): (32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256),
    (False, 2): (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
}


def frames(b1: int, b2: int, count: int, b3: int = 0, first: bytes = b"") -> bytes:
    """`count` frames of one header, the first holding `first` after its header."""
    size = frame_size(b1, b2)
    return mp3(b1, b2, b3, first, size) + mp3(b1, b2, b3, b"", size) * (count - 1)


CBR = [
    # b1: 111 VV LL P (V: 11 MPEG-1, 10 MPEG-2, 00 MPEG-2.5; L: 11 I, 10 II, 01 III; P=1 no CRC)
    # b2: bitrate index (4 bits), sample rate index (2), padding, private
    (0xFB, 0x90, 1152, 44100),  # MPEG-1 III, index 9 = 128 kbps, 44.1 kHz
    (0xFD, 0xA4, 1152, 48000),  # MPEG-1 II, index 10 = 192 kbps, 48 kHz
    (0xFF, 0xE8, 384, 32000),  # MPEG-1 I, index 14 = 448 kbps, 32 kHz
    (0xF3, 0x80, 576, 22050),  # MPEG-2 III, index 8 = 64 kbps, 22.05 kHz
    (0xF7, 0xE8, 384, 16000),  # MPEG-2 I, index 14 = 256 kbps, 16 kHz
    (0xE3, 0x18, 576, 8000),  # MPEG-2.5 III, index 1 = 8 kbps, 8 kHz
    (0xFB, 0x92, 1152, 44100),  # padded frames: a byte more each
]


@pytest.mark.parametrize(("b1", "b2", "samples", "rate"), CBR)
def test_cbr_mp3_counts_its_frames(b1: int, b2: int, samples: int, rate: int) -> None:
    assert audio_duration_s(frames(b1, b2, 50)) == 50 * samples / rate
    # ID3v2 in front, ID3v1 ("TAG" and 125 bytes) behind: neither is audio
    tagged = id3(300) + frames(b1, b2, 50) + b"TAG" + b"\0" * 125
    assert audio_duration_s(tagged) == 50 * samples / rate


def test_vbr_mp3_without_a_vbr_header_counts_its_frames() -> None:
    """Issue 42 finding 5: a first frame at 160 kbps and the rest at 8 kbps was metered at
    the first's bitrate, 20 times short."""
    data = frames(0xF3, 0xE0, 1) + frames(0xF3, 0x10, 3000) + frames(0xF3, 0x82, 7)
    assert audio_duration_s(data) == 3008 * 576 / 22050


def test_junk_between_frames_counts_at_the_highest_bitrate() -> None:
    """Bytes that are no frame of the stream (another stream's, garbage) are no shorter
    than at the stream's highest bitrate: what cannot be walked is still paid for."""
    other = frames(0xE3, 0x18, 1000)  # MPEG-2.5 8 kHz frames in an MPEG-1 44.1 kHz stream
    data = frames(0xFB, 0x90, 10) + other + frames(0xFB, 0x90, 10)
    assert audio_duration_s(data) == pytest.approx(len(data) * 8 / 320_000)
    garbage = frames(0xFB, 0x90, 10) + b"\xff\xfb" * 50_000 + frames(0xFB, 0x90, 10)
    assert audio_duration_s(garbage) == pytest.approx(len(garbage) * 8 / 320_000)


def test_vbr_mp3_counts_frames_from_its_xing_info_or_vbri_header() -> None:
    side_stereo, side_mono_v2 = b"\0" * 32, b"\0" * 9  # side info: MPEG-1 stereo, MPEG-2 mono
    xing = b"Xing" + struct.pack(">II", 0x0F, 3675)  # flags (frames, bytes, TOC, quality)
    # 3,675 frames × 1,152 samples / 44,100 Hz
    assert audio_duration_s(mp3(0xFB, 0x50, 0, side_stereo + xing, 4000)) == 96.0
    # behind a CRC (P=0) the side info starts 2 bytes later
    assert audio_duration_s(mp3(0xFA, 0x50, 0, b"\0\0" + side_stereo + xing, 4000)) == 96.0
    # MPEG-2 III mono (channel mode 11): 1,225 frames × 576 / 22,050 Hz
    info = b"Info" + struct.pack(">II", 0x01, 1225)
    assert audio_duration_s(id3(40) + mp3(0xF3, 0x80, 0xC0, side_mono_v2 + info, 600)) == 32.0
    # VBRI, 32 bytes after the header: version, delay, quality, bytes, frames: 2,500 × 1,152
    # / 48 kHz
    vbri = b"VBRI" + struct.pack(">HHHII", 1, 0, 75, 100000, 2500)
    assert audio_duration_s(mp3(0xFB, 0x94, 0, side_stereo + vbri, 4000)) == 60.0


def test_a_vbr_header_can_only_add_to_the_frames_counted() -> None:
    """A Xing header that counts 10 frames in front of 2,000 (or none, by its flags) is
    read as the 2,000 a decoder plays."""
    for flags in (0x0F, 0x06):
        xing = b"\0" * 32 + b"Xing" + struct.pack(">II", flags, 10)
        data = frames(0xFB, 0x90, 2000, first=xing)
        assert audio_duration_s(data) == 2000 * 1152 / 44100


def test_mp3_after_id3_padding_but_not_bytes_that_only_look_like_one() -> None:
    tagged = id3(10) + b"\0" * 100 + frames(0xFB, 0x90, 38)
    assert audio_duration_s(tagged) == 38 * 1152 / 44100
    not_audio = [
        b"\0" * 64 + mp3(0xFB, 0x90, 0, b"", 100),  # no sync at the start, no ID3 tag
        mp3(0xF1, 0x50, 0, b"", 100),  # AAC ADTS (layer bits 00)
        mp3(0xFB, 0x00, 0, b"", 100),  # free-format bitrate
        mp3(0xFB, 0xF0, 0, b"", 100),  # bitrate index 15
        mp3(0xEB, 0x90, 0, b"", 100),  # reserved version 01
        b"\x1aE\xdf\xa3" + b"\0" * 60,  # WebM
        b"",
    ]
    for data in not_audio:
        with pytest.raises(AudioError, match="not recognised"):
            audio_duration_s(data)


@pytest.mark.timeout(30)
def test_mp3_frames_are_counted_in_linear_time() -> None:
    """8 MiB of the smallest frames (32 bytes), of sync bytes, of near-headers: one pass."""
    for data, least in (
        (frames(0xFF, 0x14, 8 * 2**20 // 32), 262144 * 384 / 48000),
        (frames(0xFF, 0x14, 1) + b"\xff" * 8 * 2**20, 8 * 2**20 * 8 / 448_000),
        (frames(0xFB, 0x90, 1) + b"\xff\xfb\x90" * 2**20, 3 * 2**20 * 8 / 320_000),
    ):
        assert audio_duration_s(data) >= least


def ogg_page(serial: int, sequence: int, granule: int, packet: bytes, kind: int = 0) -> bytes:
    """ "OggS", version 0, header type (1 continued, 2 first, 4 last), 64-bit granule position,
    serial number, page sequence, CRC (0: not checked), then the segment table (the packet's
    length in lacing values of up to 255) and the packet."""
    lacing = [255] * (len(packet) // 255) + [len(packet) % 255]
    header = struct.pack("<BBqIIIB", 0, kind, granule, serial, sequence, 0, len(lacing))
    return b"OggS" + header + bytes(lacing) + packet


# Vorbis identification: type 1, "vorbis", version, channels, rate, three bitrates, block
# sizes, framing bit
VORBIS_ID = b"\x01vorbis" + struct.pack("<IBIiiiBB", 0, 2, 44100, 0, 128000, 0, 0xB8, 1)
# Opus: "OpusHead", version 1, channels, pre-skip (312), input rate, gain, mapping family
OPUS_HEAD = b"OpusHead" + struct.pack("<BBHIhB", 1, 2, 312, 44100, 0, 0)


def test_ogg_vorbis_reads_its_own_streams_last_page() -> None:
    data = b"".join(
        [
            ogg_page(7, 0, 0, VORBIS_ID, kind=2),
            ogg_page(7, 1, 0, b"\x03vorbis" + b"\0" * 300),  # comments, two lacing values
            ogg_page(7, 2, 220500, b"\0" * 100),
            ogg_page(7, 3, 441000, b"\0" * 100),
            ogg_page(9, 0, 999999, b"\0" * 10, kind=2),  # another stream, multiplexed
            ogg_page(7, 4, -1, b"\0" * 255),  # no packet ends on this page
        ]
    )
    assert audio_duration_s(data) == 10.0  # 441,000 / 44,100


def test_ogg_opus_counts_at_48_khz_after_its_pre_skip() -> None:
    data = b"".join(
        [
            ogg_page(3, 0, 0, OPUS_HEAD, kind=2),
            ogg_page(3, 1, 0, b"OpusTags" + b"\0" * 8),
            ogg_page(3, 2, 3 * 48000 + 312, b"\0" * 50, kind=4),
        ]
    )
    assert audio_duration_s(data) == 3.0


def test_broken_ogg_streams_are_refused() -> None:
    flac_in_ogg = ogg_page(1, 0, 0, b"\x7fFLAC" + b"\0" * 40, kind=2)
    early = ogg_page(1, 0, 0, OPUS_HEAD, kind=2) + ogg_page(1, 1, 100, b"\0")  # < pre-skip
    no_rate = ogg_page(1, 0, 0, VORBIS_ID.replace(struct.pack("<I", 44100), b"\0" * 4), kind=2)
    not_first = ogg_page(1, 0, 0, VORBIS_ID)
    no_length = ogg_page(1, 0, -1, VORBIS_ID, kind=2)
    truncated = ogg_page(1, 0, 0, OPUS_HEAD, kind=2)[:35]
    for data in (flac_in_ogg, early, no_rate, not_first, no_length, truncated):
        with pytest.raises(AudioError):
            audio_duration_s(data)


def box(kind: bytes, payload: bytes) -> bytes:
    """An MP4 box: 32-bit size (header included), 4-byte type, payload."""
    return struct.pack(">I", 8 + len(payload)) + kind + payload


def mvhd(version: int, timescale: int, duration: int) -> bytes:
    """Version and flags; creation and modification times, timescale, duration (32-bit
    times in version 0, 64-bit in version 1); rate, volume, reserved, matrix, pre-defined,
    next track id."""
    if version == 0:
        times = struct.pack(">IIII", 1, 2, timescale, duration)
    else:
        times = struct.pack(">QQIQ", 1, 2, timescale, duration)
    rest = struct.pack(">IH10x36x24xI", 0x00010000, 0x0100, 2)
    return box(b"mvhd", bytes([version, 0, 0, 0]) + times + rest)


FTYP = box(b"ftyp", b"M4A " + struct.pack(">I", 0) + b"isomM4A ")


def test_mp4_mvhd_version_0_after_a_64_bit_sized_mdat() -> None:
    mdat = struct.pack(">I4sQ", 1, b"mdat", 16 + 1000) + b"\0" * 1000  # size 1: 64-bit follows
    moov = box(b"moov", mvhd(0, 44100, 441000) + box(b"trak", b"\0" * 20))
    assert len(mvhd(0, 1, 1)) == 108
    assert audio_duration_s(FTYP + box(b"free", b"") + mdat + moov) == 10.0


def test_mp4_mvhd_version_1_before_an_mdat_running_to_the_end() -> None:
    moov = box(b"moov", box(b"udta", b"") + mvhd(1, 1000, 90500))
    mdat = struct.pack(">I4s", 0, b"mdat") + b"\0" * 500  # size 0: to the end of the file
    assert len(mvhd(1, 1, 1)) == 120
    assert audio_duration_s(FTYP + moov + mdat) == 90.5


def test_broken_mp4_headers_are_refused() -> None:
    broken = [
        FTYP,  # no moov
        FTYP + box(b"moov", box(b"trak", b"")),  # no mvhd
        FTYP + box(b"moov", mvhd(0, 1000, 0xFFFFFFFF)),  # duration unknown
        FTYP + box(b"moov", mvhd(0, 0, 1000)),  # no timescale
        FTYP + box(b"moov", mvhd(0, 1000, 0)),  # fragmented: durations in the fragments
        FTYP + struct.pack(">I4s", 9999, b"moov") + mvhd(0, 1000, 1000),  # overruns the file
        FTYP + box(b"moov", struct.pack(">I4s", 4, b"mvhd")),  # a box smaller than its header
        FTYP + box(b"moov", box(b"mvhd", b"\0" * 10)),  # truncated mvhd
    ]
    for data in broken:
        with pytest.raises(AudioError):
            audio_duration_s(data)


def test_durations_over_24_hours_are_refused() -> None:
    assert MAX_DURATION_S == 24 * 3600
    assert audio_duration_s(FTYP + box(b"moov", mvhd(1, 1, 24 * 3600))) == MAX_DURATION_S
    for data in (
        FTYP + box(b"moov", mvhd(1, 1, 24 * 3600 + 1)),
        flac(1, 1, 8, (1 << 36) - 1),
        FTYP + box(b"moov", mvhd(1, 1, (1 << 64) - 2)),
    ):
        with pytest.raises(AudioError, match="24 hours"):
            audio_duration_s(data)


def test_the_format_comes_from_the_bytes_and_the_name_only_from_errors() -> None:
    assert audio_duration_s(wav_bytes(16000, 1, 2, 8000), "speech.mp3", "audio/mpeg") == 0.5
    with pytest.raises(AudioError, match=r"clip\.webm.*audio/webm.*not recognised") as refused:
        audio_duration_s(b"\x1aE\xdf\xa3" + b"\0" * 60, "clip.webm", "audio/webm")
    assert refused.value.param == "file"


SAMPLES = [
    wav_bytes(8000, 1, 2, 800),
    riff((b"fmt ", CODECS[0][0]), (b"data", b"\0" * 80)),  # µ-law
    riff((b"fmt ", CODECS[4][0]), (b"data", b"\0" * 512)),  # IMA ADPCM
    frames(0xF3, 0xE0, 1) + frames(0xF3, 0x10, 6),  # MP3 without a VBR header
    flac(44100, 2, 16, 441000),
    mp3(0xFB, 0x50, 0, b"\0" * 32 + b"Xing" + struct.pack(">II", 1, 3675), 200),
    ogg_page(3, 0, 0, OPUS_HEAD, kind=2) + ogg_page(3, 1, 48312, b"\0" * 5),
    FTYP + box(b"moov", mvhd(1, 1000, 90500)),
]
MAGICS = [
    b"RIFF\0\0\0\0WAVE",
    b"fLaC",
    b"ID3\x04\0\0\0\0\0\x10",
    b"OggS",
    b"\0\0\0\x10ftyp",
    b"\xff\xfb",
]
audio_bytes = st.one_of(
    st.binary(max_size=512),
    st.builds(lambda magic, tail: magic + tail, st.sampled_from(MAGICS), st.binary(max_size=256)),
    st.builds(
        lambda sample, cut, flip: bytes(b ^ flip if i == cut else b for i, b in enumerate(sample)),
        st.sampled_from(SAMPLES),
        st.integers(0, 200),
        st.integers(1, 255),
    ),
    st.builds(lambda sample, cut: sample[:cut], st.sampled_from(SAMPLES), st.integers(0, 200)),
)


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(audio_bytes)
def test_arbitrary_bytes_give_a_sane_duration_or_an_audio_error(data: bytes) -> None:
    try:
        seconds = audio_duration_s(data, "upload")
    except AudioError as refused:
        assert refused.param == "file" and refused.message
    else:
        assert 0 <= seconds <= MAX_DURATION_S


LINEAR = {1: None, 3: (32, 64), 6: (8,), 7: (8,)}  # tag: bits per sample it takes (None: any)


@st.composite
def wav_files(draw) -> tuple[bytes, float]:
    """A WAV file of any metered codec, plain or EXTENSIBLE, and its true duration."""
    rate, channels = draw(st.integers(1000, 192000)), draw(st.integers(1, 2))
    tag = draw(st.sampled_from([1, 3, 6, 7, 0x11, 2]))
    if tag in LINEAR:
        channels = draw(st.integers(1, 8))
        bits = draw(st.sampled_from(LINEAR[tag] or (8, 12, 16, 24, 32)))
        block, samples = channels * (1 if tag in (6, 7) else (bits + 7) // 8), 1
        fmt = pcm_fmt(tag, channels, rate, rate * block, block, bits)
        if draw(st.booleans()):
            guid = struct.pack("<H", tag) + PCM_GUID[2:]
            fmt = pcm_fmt(0xFFFE, channels, rate, rate * block, block, bits)
            fmt += struct.pack("<HHI", 22, bits, 0) + guid
    else:
        header, first = (4, 1) if tag == 0x11 else (7, 2)
        block = header * channels + channels * draw(st.integers(1, 1024))
        samples = (block - header * channels) * 2 // channels + first
        fmt = pcm_fmt(tag, channels, rate, rate * block // samples, block, 4)
        fmt += struct.pack("<HH", 2, samples)
    count = draw(st.integers(0, 300))
    return riff((b"fmt ", fmt), (b"data", b"\0" * (count * block))), count * samples / rate


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(wav_files(), st.integers(0, 15), st.integers(1, 1000))
def test_a_wav_is_metered_at_its_duration_and_a_changed_header_never_shorter(
    wav: tuple[bytes, float], field: int, factor: int
) -> None:
    """Byte rate and block size multiplied (the lie of finding 5), or any fmt byte changed:
    refused, or metered at no less than what a decoder plays."""
    data, seconds = wav
    assert audio_duration_s(data) == pytest.approx(seconds)
    fmt = 20  # the fmt chunk's body: tag, channels, rate, byte rate, block align, bits
    lied = bytearray(data)
    byte_rate, align = struct.unpack_from("<IH", data, fmt + 8)
    struct.pack_into("<IH", lied, fmt + 8, byte_rate * factor & 0xFFFFFFFF, align * factor & 0xFFFF)
    lied[fmt + field] ^= 0x5A if field not in (8, 9, 10, 11, 12, 13) else 0
    with contextlib.suppress(AudioError):
        decoded = riff_frames(bytes(lied))
        if decoded is not None:
            assert audio_duration_s(bytes(lied)) >= decoded - 1e-9


def riff_frames(data: bytes) -> float | None:
    """What a decoder that reads the sample width from bits per sample plays of a linear
    WAV (as libsndfile does, whatever the byte rate and block size say); None otherwise."""
    tag, channels, rate, _, _, bits = struct.unpack_from("<HHIIHH", data, 20)
    if tag not in LINEAR or not channels or not rate or not bits:
        return None
    width = 1 if tag in (6, 7) else (bits + 7) // 8
    (size,) = struct.unpack_from("<I", data, 40)
    return min(size, len(data) - 44) // (channels * width) / rate


BITRATES = {0xFB: range(1, 15), 0xF3: range(1, 15), 0xE3: range(1, 15)}


@st.composite
def mp3_files(draw) -> tuple[bytes, float, bool]:
    """Frames of one stream at bitrates of its own, junk between them or not: the file,
    the seconds its frames play, and whether junk is in it."""
    b1 = draw(st.sampled_from(sorted(BITRATES)))
    rate_index = draw(st.integers(0, 2))
    samples, rates = (1152, (44100, 48000, 32000)) if b1 == 0xFB else (576, None)
    rate = (
        rates[rate_index]
        if rates
        else {0xF3: (22050, 24000, 16000), 0xE3: (11025, 12000, 8000)}[b1][rate_index]
    )
    parts, count, junk = [], 0, False
    for _ in range(draw(st.integers(1, 40))):
        index, pad = draw(st.sampled_from(BITRATES[b1])), draw(st.integers(0, 1))
        b2 = index << 4 | rate_index << 2 | pad << 1
        parts.append(frames(b1, b2, n := draw(st.integers(1, 5))))
        count += n
        if draw(st.integers(0, 4)) == 0:
            parts.append(draw(st.binary(max_size=300)).replace(b"\xff", b"\xfe"))
            junk = True
    return b"".join(parts), count * samples / rate, junk


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(mp3_files())
def test_an_mp3_is_metered_at_no_less_than_its_frames_play(mp3_file) -> None:
    data, seconds, junk = mp3_file
    metered = audio_duration_s(data)
    assert metered >= seconds - 1e-9
    if not junk:  # frames alone: at most the bytes at the highest bitrate above them
        assert metered == pytest.approx(
            max(seconds, len(data) * 8 / (320_000 if data[1] == 0xFB else 160_000))
        )


def test_the_engines_reported_seconds_are_read_from_its_usage_object() -> None:
    assert reported_seconds({"type": "duration", "seconds": 393}) == 393.0
    assert reported_seconds({"type": "duration", "seconds": 2.5}) == 2.5
    for usage in (
        None,
        {},
        {"prompt_tokens": 3, "completion_tokens": 1},  # a stream's token usage: not seconds
        {"type": "tokens", "seconds": 3},
        {"type": "duration", "seconds": True},
        {"type": "duration", "seconds": "3"},
        {"type": "duration", "seconds": -1},
        {"type": "duration", "seconds": float("inf")},
    ):
        assert reported_seconds(usage) is None
