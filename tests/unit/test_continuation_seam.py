"""Stop strings across a continuation's seam (gpuroute/continuation/seam.py): what vLLM
would have stopped at had it generated the whole answer itself."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuroute.continuation.seam import SeamWatch, holds_back, stop_strings


def test_stop_strings_are_read_as_engines_read_them() -> None:
    assert stop_strings({"stop": "\n\n"}) == ("\n\n",)
    assert stop_strings({"stop": ["END", "", 3]}) == ("END",)
    assert stop_strings({}) == ()
    assert holds_back({"stop": ["x"]}) and not holds_back(
        {"stop": "x", "include_stop_str_in_output": True}
    )
    assert not holds_back({"stop": []})


@pytest.mark.parametrize(
    ("body", "before", "pieces", "relayed", "stop"),
    [
        ({"stop": "\n\n"}, "para one\n", ["\nnext"], [""], "\n\n"),
        ({"stop": "\n\n", "include_stop_str_in_output": True}, "one\n", ["\nnext"], ["\n"], "\n\n"),
        ({"stop": ["END"]}, "the E", ["N", "D and more"], ["", ""], "END"),  # "N" held back
        ({"stop": ["END"]}, "the E", ["N", "o"], ["", "No"], None),  # released: not a stop
        ({"stop": ["END"], "include_stop_str_in_output": True}, "E", ["ND!"], ["ND"], "END"),
        ({"stop": ["END"]}, "the E", ["nd", "END"], ["nd", "END"], None),  # the engine's own
        ({"stop": ["abc", "xab"]}, "xa", ["bc"], [""], "xab"),  # the earliest completed wins
        ({"stop": ["bx"]}, "a", ["bxc"], ["bxc"], None),  # all after the seam: the engine's
        ({}, "anything", ["more"], ["more"], None),
    ],
)
def test_a_stop_string_across_the_seam_ends_the_answer(body, before, pieces, relayed, stop) -> None:
    seam = SeamWatch(body, before)
    out = [seam.feed(p) for p in pieces]
    assert [text for text, _ in out] == relayed
    assert next((s for _, s in out if s), None) == stop


@given(st.text("ab\n", max_size=12), st.text("ab\n", min_size=1, max_size=12),
       st.lists(st.integers(1, 4), max_size=6))  # fmt: skip
def test_the_seam_stops_where_one_engine_would_have(before, after, cuts) -> None:
    """Against a whole-text reference: the first stop string that ends after the seam and
    begins before it is found however the continuation's text is cut into pieces, and the
    client gets none of it (what a stop string might take is held until it cannot)."""
    body = {"stop": ["\n\n", "aba"]}
    pieces, rest = [], after
    for n in cuts:
        pieces.append(rest[:n])
        rest = rest[n:]
    pieces = [p for p in [*pieces, rest] if p]
    seam = SeamWatch(body, before)
    relayed, found = "", None
    for piece in pieces:  # (a stop ends the answer: the splice reads no further)
        text, found = seam.feed(piece)
        relayed += text
        if found:
            break
    relayed += seam.release()
    # the reference: one engine writing the whole text a character at a time, stopping at
    # the first stop string (list order on a tie) that ends after the break and began before
    whole, cut, expected = before + after, len(before), None
    for end in range(cut + 1, len(whole) + 1):
        ending = [s for s in body["stop"] if whole[:end].endswith(s) and end - len(s) < cut]
        if ending:
            expected = ending[0]
            break
    assert found == expected
    assert relayed == ("" if expected else after)  # nothing of a stop string, nor after it
