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
    """Reads the continuation's first characters against the text before the break, holding
    back what a stop string begun before it could still take (as vLLM holds back the text a
    stop string could begin), at most the longest stop string's length less one."""

    __slots__ = ("done", "held", "include", "new", "stops", "tail", "width")

    def __init__(self, body: dict, text_before: str) -> None:
        self.stops = stop_strings(body)
        self.include = body.get("include_stop_str_in_output") is True
        self.width = max((len(s) for s in self.stops), default=1) - 1
        self.tail = text_before[-self.width :] if self.width else ""
        self.new = ""  # the continuation's text while a stop string could still span
        self.held = ""  # the end of `new`, not yet relayed
        self.done = not self.tail  # nothing can span the break any more

    def feed(self, piece: str) -> tuple[str, str | None]:
        """What the client gets now of the continuation's text (`piece`, after what was
        held), and the stop string that completed across the break (None: none did; once
        none can, the engine watches the rest)."""
        if self.done or not piece:
            return piece, None
        relayed_to = len(self.tail) + len(self.new) - len(self.held)  # in the window
        self.new += piece
        window = self.tail + self.new
        stop = self._spanning(window)
        if stop is not None:
            at, matched = stop
            end = at + len(matched) if self.include else at
            self.done, self.held = True, ""
            return window[relayed_to:end] if end > relayed_to else "", matched
        self.held = window[relayed_to:]
        if len(self.new) < self.width and self._may_span(window):
            return "", None
        return self.release(), None

    def release(self) -> str:
        """What is held, now no stop string can take it (its stream ended, or went past)."""
        out, self.held, self.done = self.held, "", True
        return out

    def _spanning(self, window: str) -> tuple[int, str] | None:
        """The earliest completed stop string that began before the break."""
        found = []  # (where it ends, where it begins, it), in the stop list's order
        for stop in self.stops:
            at = window.find(stop, max(len(self.tail) - len(stop) + 1, 0))
            if 0 <= at < len(self.tail):
                found.append((at + len(stop), at, stop))
        return min(found, key=lambda f: f[0])[1:] if found else None  # (ties: list order)

    def _may_span(self, window: str) -> bool:
        """Whether a stop string begun before the break could still complete."""
        for stop in self.stops:
            for at in range(max(len(self.tail) - len(stop) + 1, 0), len(self.tail)):
                rest = window[at:]
                if len(rest) < len(stop) and stop.startswith(rest):
                    return True
        return False
