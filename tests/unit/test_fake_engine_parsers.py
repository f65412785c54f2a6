"""The fake engine's readers of what a client sends: a WAV file's duration (what its
speech-to-text routes are paced and metered by) and its tokenizer (/tokenize and
/detokenize invert each other and count as gpuroute.prompt estimates)."""

from __future__ import annotations

import pytest
from gpuroute.testbed.fake_engine.audio import wav_duration, windows
from gpuroute.testbed.fake_engine.tokenize import decode, encode
from support.fake_engine_app import wav

from gpuroute.prompt import estimate_tokens


def test_wav_headers_give_the_duration() -> None:
    assert wav_duration(wav(2.5)) == 2.5
    assert wav_duration(wav(1.0, rate=44100, channels=2, bits=32, tag=3)) == 1.0  # float
    listing = b"LIST" + (3).to_bytes(4, "little") + b"abc\0"  # an odd chunk, padded
    assert wav_duration(wav(0.5, extra_chunk=listing)) == 0.5
    assert wav_duration(wav(1.0, data_size=0xFFFFFFFF)) == 1.0  # streamed: size unknown
    assert wav_duration(wav(1.0)[:-16000]) == 0.5  # cut short: what is there
    lying = wav(2.0, rate=8000, bits=8, tag=7)  # µ-law, its byte rate then made 1,000 times
    lying = lying[:28] + (8_000_000).to_bytes(4, "little") + lying[32:]
    assert wav_duration(lying) == 2.0  # its samples, as a decoder plays them
    for bad in (b"", b"ID3\x04 an mp3", b"RIFF\0\0\0\0WAVEdata\0\0\0\0", wav(1.0, rate=0)):
        with pytest.raises(ValueError):
            wav_duration(bad)
    assert windows(61.0) == [30.0, 30.0, 1.0] and windows(0.2) == [0.2]


def test_the_fake_tokenizer_inverts_itself_and_counts_as_the_router() -> None:
    for text in ("hello world", "héllo wörld", "日本語のテキスト", "a\x00b", ""):
        assert decode(encode(text)) == text
    text = "The quick brown fox jumps over the lazy dog"
    assert len(encode(text)) == estimate_tokens(text)
    assert decode([1, 2, 3, 2**62]) == ""  # ids it never gives: nothing, as vLLM's unknown ids
