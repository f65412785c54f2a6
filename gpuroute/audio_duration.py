"""The duration of an audio upload (`/v1/audio/transcriptions`, `/translations`), read
from its container as a decoder plays it, which prices and meters the request before an
engine decodes a byte; and the seconds an engine reports transcribing, which settle that
charge. The readers take a body the router has bounded (8 MiB by default), run in time
linear in it, and refuse what they cannot read or check with `AudioError` (a 400)."""

from __future__ import annotations

import functools
import math
import re
import struct
from collections.abc import Iterable, Mapping
from typing import Any

from gpuroute.audio import AudioError

MAX_DURATION_S = 24 * 3600.0
_SYNC_SCAN = 4096  # bytes searched for the first MP3 frame after an ID3 tag's padding
_MAX_ITEMS = 4096  # RIFF chunks, MP4 boxes or Ogg pages looked at: real files need a few


def audio_duration_s(
    data: bytes, filename: str | None = None, content_type: str | None = None
) -> float:
    """Seconds of audio in `data`, from its header; the format is sniffed from its first
    bytes (a client's filename or type can be wrong: they only name the file in errors)."""
    try:
        seconds = _sniffed_duration(data)
        if not math.isfinite(seconds) or seconds < 0:
            raise AudioError("the header gives an impossible duration")
        if seconds > MAX_DURATION_S:
            raise AudioError(f"the audio lasts {seconds:.0f} s: more than 24 hours is refused")
    except AudioError as exc:
        described = f"{filename!r}"[:80] if filename else "the file"
        kind = f" ({content_type[:60]})" if content_type else ""
        raise AudioError(f"{described}{kind}: {exc.message}", "file") from None
    return seconds


def reported_seconds(usage: Mapping[str, Any] | None) -> float | None:
    """The seconds of audio an engine's usage says it transcribed (vLLM's and OpenAI's
    `{"type": "duration", "seconds": N}`), which settle what the container's header was
    charged; None for any other usage, or a number that is none."""
    if not usage or usage.get("type") != "duration":
        return None
    seconds = usage.get("seconds")
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        return None
    return float(seconds) if math.isfinite(seconds) and seconds >= 0 else None


def _sniffed_duration(data: bytes) -> float:
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return _wav(data)
    if data[:4] == b"OggS":
        return _ogg(data)
    if data[4:8] == b"ftyp":
        return _mp4(data)
    start = _skip_id3(data)
    if data[start : start + 4] == b"fLaC":
        return _flac(data, start)
    return _mp3(data, start)


def _read(fmt: str, data: bytes, offset: int) -> tuple[Any, ...]:
    """struct.unpack_from, a short read reported as a truncated header."""
    try:
        return struct.unpack_from(fmt, data, offset)
    except struct.error:
        raise AudioError("the audio header is truncated") from None


def _wav(data: bytes) -> float:
    """The `data` chunk's length in the `fmt ` chunk's units: frames of samples, or ADPCM
    blocks of samples, as decoders count them; the header's byte rate, which decoders never
    read, must agree where it can be checked, so that a lie fails rather than meters short."""
    pos, unit = 12, None
    for _ in range(_MAX_ITEMS):
        chunk, size = _read("<4sI", data, pos)
        body = pos + 8
        if chunk == b"fmt ":
            unit = _wav_unit(data, body, size)
        elif chunk == b"data":
            if unit is None:
                raise AudioError("the WAV data chunk comes before its fmt chunk")
            present = max(0, len(data) - body)
            # 0 and 0xFFFFFFFF: written by streaming encoders that could not seek back
            length = present if size in (0, 0xFFFFFFFF) else min(size, present)
            block, samples, rate = unit
            return -(-length // block) * samples / rate  # a cut last block counted whole
        pos = body + size + (size & 1)
    raise AudioError("the WAV file has too many chunks before its data")


# WAVE format tags (RFC 2361) whose duration the fmt chunk gives: linear samples (PCM, IEEE
# float, A-law, µ-law) and ADPCM blocks (Microsoft's, IMA's, GSM 6.10's); EXTENSIBLE names one
# of them in its sub-format GUID. Any other codec's length cannot be checked here: refused.
_PCM, _MS_ADPCM, _FLOAT, _ALAW, _MULAW, _IMA_ADPCM, _GSM610 = 1, 2, 3, 6, 7, 0x11, 0x31
_EXTENSIBLE = 0xFFFE
_GUID_TAIL = bytes.fromhex("000000001000800000aa00389b71")  # KSDATAFORMAT_SUBTYPE_* after the tag
_CODECS = "PCM, float, A-law, µ-law, MS or IMA ADPCM or GSM 6.10"


def _wav_unit(data: bytes, body: int, size: int) -> tuple[int, int, int]:
    """(bytes a block, samples a block, sample rate) of a `fmt ` chunk, or AudioError."""
    if size < 16:
        raise AudioError("the WAV fmt chunk is too short")
    tag, channels, rate, byte_rate, align, bits = _read("<HHIIHH", data, body)
    if tag == _EXTENSIBLE:
        if size < 40:
            raise AudioError("the WAV fmt chunk is too short")
        tag, tail = _read("<H14s", data, body + 24)
        if tail != _GUID_TAIL or tag == _EXTENSIBLE:
            raise AudioError(f"the WAV EXTENSIBLE sub-format is not one of {_CODECS}")
    if not channels or not rate or not align:
        raise AudioError("the WAV fmt chunk gives no channels, sample rate or block size")
    if tag in (_PCM, _FLOAT, _ALAW, _MULAW):
        width = 1 if tag in (_ALAW, _MULAW) else (bits + 7) // 8
        if not bits or align != channels * width or byte_rate != rate * align:
            raise AudioError("the WAV fmt chunk's block size or byte rate is inconsistent")
        return align, 1, rate
    samples = _adpcm_block_samples(tag, channels, align, bits)
    # after cbSize, MS and IMA ADPCM give the samples a block, which decoders may believe
    if tag != _GSM610 and size >= 20 and _read("<H", data, body + 18)[0] != samples:
        raise AudioError("the WAV ADPCM samples a block disagree with its block size")
    return align, samples, rate


def _adpcm_block_samples(tag: int, channels: int, align: int, bits: int) -> int:
    """Samples a channel in an ADPCM block, from its size: a header of one (IMA) or two
    (MS) samples a channel, then 4-bit codes; GSM 6.10: 320 samples in 65 bytes, mono."""
    if tag == _GSM610:
        if channels != 1 or align != 65:
            raise AudioError("a GSM 6.10 WAV must be mono in blocks of 65 bytes")
        return 320
    if tag not in (_MS_ADPCM, _IMA_ADPCM):
        raise AudioError(f"WAV codec 0x{tag:04x} is not metered here: send {_CODECS} WAV, "
                         "or FLAC, MP3, Ogg or MP4")  # fmt: skip
    header, head_samples = (7, 2) if tag == _MS_ADPCM else (4, 1)
    codes = align - header * channels
    if bits != 4 or channels > 2 or codes <= 0:
        raise AudioError("the WAV ADPCM block size or bits per sample is inconsistent")
    return codes * 2 // channels + head_samples


def _flac(data: bytes, start: int) -> float:
    """STREAMINFO, always the first metadata block: total samples over the sample rate."""
    (block,) = _read(">I", data, start + 4)
    if block >> 24 & 0x7F != 0 or block & 0xFFFFFF != 34:
        raise AudioError("FLAC's first metadata block is not a STREAMINFO")
    (packed,) = _read(">Q", data, start + 18)  # past the block and frame size bounds
    rate, total = packed >> 44, packed & ((1 << 36) - 1)
    if not rate or not total:
        raise AudioError("FLAC STREAMINFO gives no sample rate or no sample count")
    return total / rate


def _skip_id3(data: bytes) -> int:
    """Past any ID3v2 tags (syncsafe sizes, optional footer); some files carry several."""
    pos = 0
    for _ in range(8):
        if not data.startswith(b"ID3", pos):
            break
        flags, *size = _read(">5xB4B", data, pos)
        if max(size) >= 0x80:
            raise AudioError("the ID3v2 tag's size is not syncsafe")
        length = size[0] << 21 | size[1] << 14 | size[2] << 7 | size[3]
        pos += 10 + length + (10 if flags & 0x10 else 0)
    return pos


_MP3_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}
_MP3_KBPS = {  # (MPEG-1 or not, layer): bitrates for indexes 1 to 14
    (True, 1): (32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448),
    (True, 2): (32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384),
    (True, 3): (32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    (False, 1): (32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256),
    (False, 2): (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),  # and layer III
}


def _frame_table() -> dict[int, tuple[int, int, int, int, int]]:
    """Every valid MPEG audio frame header's second and third bytes (version, layer, CRC
    flag; bitrate, sample rate, padding, private bit) mapped to: the stream it belongs to
    (version, layer and rate: what every frame of one stream shares), the frame's size in
    bytes, its samples, its sample rate and its stream's highest bitrate. Free-format and
    reserved values are absent: no fixed size."""
    table = {}
    for b1 in range(0xE0, 0x100):
        version, layer_bits = b1 >> 3 & 3, b1 >> 1 & 3
        if version == 1 or not layer_bits:
            continue
        layer, mpeg1 = 4 - layer_bits, version == 3
        samples = 384 if layer == 1 else 1152 if mpeg1 or layer == 2 else 576
        kbps_row = _MP3_KBPS[mpeg1, layer if mpeg1 else min(layer, 2)]
        for b2 in range(256):
            index, rate_index, pad = b2 >> 4, b2 >> 2 & 3, b2 >> 1 & 1
            if index in (0, 15) or rate_index == 3:
                continue
            rate, bps = _MP3_RATES[version][rate_index], kbps_row[index - 1] * 1000
            # layer I counts 4-byte slots; the others bytes: samples / 8 bits of bitrate
            size = (12 * bps // rate + pad) * 4 if layer == 1 else samples // 8 * bps // rate + pad
            stream = (b1 & 0xFE) << 2 | rate_index
            table[b1 << 8 | b2] = (stream, size, samples, rate, kbps_row[-1])
    return table


_FRAMES = _frame_table()


def _mp3(data: bytes, start: int) -> float:
    """The frames a decoder plays, counted one after another (a VBR header's count, which
    may lie, can only add to them), and never less than the bytes at the stream's highest
    bitrate (bytes a walk skipped as not frames). The first frame may follow an ID3 tag's
    padding."""
    pos, limit, first = start - 1, start + (_SYNC_SCAN if start else 1), None
    while first is None and (pos := data.find(b"\xff", pos + 1, limit)) >= 0:
        first = _FRAMES.get(data[pos + 1] << 8 | data[pos + 2]) if pos + 3 < len(data) else None
    if first is None:
        raise AudioError("audio format not recognised (WAV, FLAC, MP3, Ogg Vorbis/Opus or MP4)")
    stream, _, samples, rate, top_kbps = first
    end = len(data) - 128 if data[-128:-125] == b"TAG" else len(data)  # an ID3v1 tag
    played = max(_stream_frames(data, pos, end, stream), _vbr_frames(data, pos)) * samples
    return max(played / rate, max(0, end - pos) * 8 / (top_kbps * 1000))


def _stream_frames(data: bytes, pos: int, end: int, stream: int) -> int:
    """Frames of the stream from `pos` to `end`, each found where the last ends or, past
    bytes that are none, at the next header: a decoder's walk, as one regex in C."""
    return _frame_pattern(stream).subn(b"", memoryview(data)[pos:end])[1]


@functools.cache
def _frame_pattern(stream: int) -> re.Pattern[bytes]:
    """A whole frame of the stream: its header's sync, version and layer, a bitrate and
    padding with the rate's index (checked first: junk fails at once), then as many bytes
    as that frame holds. The matches of a scan do not overlap: each is the next frame."""
    by_size: dict[int, list[int]] = {}
    for header, (frame_stream, size, *_) in _FRAMES.items():
        if frame_stream == stream:
            by_size.setdefault(size, []).append(header)
    firsts = {header >> 8 for headers in by_size.values() for header in headers}
    frames = [_byte_class(h & 0xFF for h in headers) + b".{%d}" % (size - 3)
              for size, headers in sorted(by_size.items())]  # fmt: skip
    every = _byte_class(h & 0xFF for headers in by_size.values() for h in headers)
    head = b"\xff" + _byte_class(firsts) + b"(?=" + every + b")"
    return re.compile(head + b"(?:" + b"|".join(frames) + b")", re.DOTALL)


def _byte_class(values: Iterable[int]) -> bytes:
    return b"[" + b"".join(re.escape(bytes([v])) for v in sorted(set(values))) + b"]"


def _vbr_frames(data: bytes, pos: int) -> int:
    """The frame count of a Xing/Info header (after the side information) or a VBRI
    header (32 bytes after the header) in the first frame; 0 without one."""
    b1, b3 = data[pos + 1], data[pos + 3]
    mpeg1, mono = b1 >> 3 & 3 == 3, b3 >> 6 == 3
    side = (17 if mono else 32) if mpeg1 else (9 if mono else 17)
    xing, vbri = pos + 4 + (0 if b1 & 1 else 2) + side, pos + 36
    if data[xing : xing + 4] in (b"Xing", b"Info"):
        (flags,) = _read(">I", data, xing + 4)
        return _read(">I", data, xing + 8)[0] if flags & 1 else 0
    if data[vbri : vbri + 4] == b"VBRI":
        return _read(">I", data, vbri + 14)[0]
    return 0


def _ogg(data: bytes) -> float:
    """The last page's granule position (samples up to its end) over the rate in the
    identification header; Opus always counts at 48 kHz, after `pre_skip` priming samples."""
    version, kind, _granule, serial, _seq, _crc, segments = _read("<BBqIIIB", data, 4)
    packet = 27 + segments
    if version or not kind & 2:
        raise AudioError("the Ogg stream does not start with a first page")
    if data.startswith(b"OpusHead", packet):
        rate, skip = 48000, _read("<H", data, packet + 10)[0]
    elif data.startswith(b"\x01vorbis", packet):
        rate, skip = _read("<I", data, packet + 12)[0], 0
    else:
        raise AudioError("the Ogg stream is neither Vorbis nor Opus")
    granule = _last_granule(data, serial)
    if not rate or granule < skip:
        raise AudioError("the Ogg stream's sample rate or granule position is inconsistent")
    return (granule - skip) / rate


def _last_granule(data: bytes, serial: int) -> int:
    """The granule position of the stream's last page that ends a packet (-1: none does)."""
    pos = len(data)
    for _ in range(_MAX_ITEMS):
        pos = data.rfind(b"OggS", 0, pos)
        if pos < 0:
            break
        if pos + 27 <= len(data):
            version, _, granule, page_serial = struct.unpack_from("<BBqI", data, pos + 4)
            if version == 0 and page_serial == serial and granule != -1:
                return granule
    raise AudioError("no Ogg page gives the stream's length")


def _box(data: bytes, start: int, end: int, wanted: bytes) -> tuple[int, int]:
    """The body span of the first `wanted` MP4 box between `start` and `end`."""
    pos = start
    for _ in range(_MAX_ITEMS):
        if pos >= end:
            break
        size, kind = _read(">I4s", data, pos)
        body = pos + 8
        if size == 1:  # a 64-bit size follows the type
            size, body = _read(">Q", data, body)[0], body + 8
        elif size == 0:  # the box runs to the end of its container
            size = end - pos
        if size < body - pos or pos + size > end:
            raise AudioError("an MP4 box overruns its container")
        if kind == wanted:
            return body, pos + size
        pos += size
    raise AudioError(f"no MP4 {wanted.decode()} box found")


def _mp4(data: bytes) -> float:
    """`moov/mvhd`'s duration over its timescale (32-bit in version 0, 64-bit in version 1)."""
    start, end = _box(data, *_box(data, 0, len(data), b"moov"), b"mvhd")
    box = data[start:end]
    (version,) = _read("B", box, 0)
    fmt, at = (">IQ", 20) if version == 1 else (">II", 12)  # past version, flags, 2 dates
    scale, duration = _read(fmt, box, at)
    unknown = (1 << (64 if version == 1 else 32)) - 1
    if version > 1 or not scale or duration in (0, unknown):
        raise AudioError("the MP4 mvhd gives no duration (a fragmented file?)")
    return duration / scale
