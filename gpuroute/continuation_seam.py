"""Stop strings across a continuation's seam. An engine matches stop strings in its own
output only, so a stop string that begins in the text before the break and ends in the
continuation's would be missed: the answer would run past where it should have stopped.
The router watches the seam itself, as vLLM's detokenizer does (the earliest completed
stop string wins; `include_stop_str_in_output` keeps it in the text).

While stop strings are set (and not kept in the output), vLLM also holds back the last
characters of its text that a stop string could still begin: a stream that breaks loses
them with its token ids, so such a stream goes on from its text (`holds_back`)."""

from __future__ import annotations


def stop_strings(body: dict) -> tuple[str, ...]:
    """The request's stop strings (none empty)."""
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list):
        return ()
    return tuple(s for s in stop if isinstance(s, str) and s)


def holds_back(body: dict) -> bool:
    """The engine holds back streamed text a stop string could begin (vLLM: unless the stop
    string is kept in the output): the text the client has lags the token ids it has."""
    return bool(stop_strings(body)) and body.get("include_stop_str_in_output") is not True


class SeamWatch:
    """Reads the continuation's first characters against the text before the break."""

    __slots__ = ("include", "new", "stops", "tail", "width")

    def __init__(self, body: dict, text_before: str) -> None:
        self.stops = stop_strings(body)
        self.include = body.get("include_stop_str_in_output") is True
        self.width = max((len(s) for s in self.stops), default=1) - 1
        self.tail = text_before[-self.width :] if self.width else ""
        self.new = ""  # the continuation's text while a stop string could still span

    @property
    def open(self) -> bool:
        return bool(self.tail) and len(self.new) < self.width

    def feed(self, piece: str) -> tuple[str, str | None]:
        """What of `piece` (the continuation's next text) the client gets, and the stop
        string that completed across the seam (None: none did; the engine watches the rest)."""
        if not self.open or not piece:
            return piece, None
        start = len(self.tail) + len(self.new)  # where `piece` begins in the window
        window = self.tail + self.new + piece
        self.new += piece
        best: tuple[int, str] | None = None
        for stop in self.stops:
            at = window.find(stop, max(len(self.tail) - len(stop) + 1, 0))
            spans = 0 <= at < len(self.tail)  # begun before the break, ended after it
            if spans and (best is None or at + len(stop) < best[0] + len(best[1])):
                best = (at, stop)
        if best is None:
            return piece, None
        at, stop = best
        end = at + len(stop) if self.include else at
        return window[start:end] if end > start else "", stop
