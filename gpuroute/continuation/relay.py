"""The I/O half of continuing a broken stream, shared by both tiers (the router's across
backends, the global tier's across regions): what is kept of a stream, the verdict on its
break and the loop of continuations (gpuroute/continuation/text.py decides; this applies), the
continuing stream relayed through the splice, and the two endings. Where a continuation
goes and how it is sent is each tier's own (`BrokenStream.attempt`)."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar

from aiohttp import web

from gpuroute.continuation.splice import Splice
from gpuroute.continuation.text import (
    Broken,
    ContinuationConfig,
    finish_events,
)
from gpuroute.continuation.verdict import END, FINISH, Verdict, judge
from gpuroute.relay.body import (
    ClientWriter,
    Relayed,
    RelayEnd,
    ResponseTally,
    end,
    end_truncated,
    relay_body,
)
from gpuroute.upstream import UpstreamResponse

log = logging.getLogger("gpuroute.continuation")


class Refused(Exception):
    """The upstream placed to continue a stream answered with an error, not a stream."""


def keep(config: ContinuationConfig, tally: ResponseTally) -> None:
    """Keep a continuable stream's chunks (gpuroute/continuation/text.py `prepare`) while it is
    short enough to go on from."""
    tally.kept, tally.keep_up_to = bytearray(), config.max_recorded_bytes


class SplicedContent:
    """The continuing upstream's body as relay_body reads it: rewritten by the splice."""

    __slots__ = ("content", "splice")

    def __init__(self, content, splice: Splice) -> None:
        self.content, self.splice = content, splice

    async def readany(self) -> bytes:
        while not self.splice.ended:  # (ended by a stop string across the seam: no more)
            chunk = await self.content.readany()
            if not chunk:
                return self.splice.flush()
            if out := self.splice.feed(chunk):
                return out
        return b""


class SplicedUpstream:
    """The continuing upstream's answer as relay_body reads a stream: its headers, its body
    spliced."""

    __slots__ = ("content", "headers")

    def __init__(self, upstream: UpstreamResponse, splice: Splice) -> None:
        self.headers = upstream.headers
        self.content = SplicedContent(upstream.content, splice)


class BrokenStream(ABC):
    """One stream whose upstream broke after its client's first bytes, as a tier goes on
    with it: judged, then continued until a continuation ends it some other way, or ended
    as its engine would have, or with the explicit error (a truncated answer never looks
    complete)."""

    NOWHERE: ClassVar[str]  # why it ended when no upstream would take it
    BROKE: ClassVar[str]  # the reason its continuations are counted under

    def __init__(
        self,
        request: web.Request,
        response: web.StreamResponse,
        route: str,
        body: dict | None,
        config: ContinuationConfig,
        write_timeout_s: float | None,
        error_event: Callable[[str], bytes] | None = None,
    ) -> None:
        self.request, self.response = request, response
        self.route, self.body, self.config = route, body, config
        self.write_timeout_s, self.error_event = write_timeout_s, error_event

    @abstractmethod
    def broke(self, error: BaseException | None) -> None:
        """The verdict on the upstream whose body broke (`error`)."""

    @abstractmethod
    async def attempt(self, tally: ResponseTally, broken: Broken, tries: int) -> Relayed | None:
        """One continuation placed, sent and relayed (`relay`); None: nowhere would take
        it; Refused: its upstream answered with an error."""

    @abstractmethod
    def count(self, reason: str, outcome: str) -> None:
        """One broken stream `continued` or `ended`, and why."""

    @abstractmethod
    def message(self) -> str:
        """What the error event says broke."""

    async def carry_on(self, relayed: Relayed) -> Relayed:
        """Go on with `relayed`, broken, until it ends: how it ended (still UPSTREAM_BROKE
        where it ended with the error event)."""
        tries = 0
        while relayed.end is RelayEnd.UPSTREAM_BROKE:
            verdict = verdict_on(self.config, self.route, self.body, relayed, tries)
            if verdict is None:  # a whole answer cut short: relay_body closed it
                self.broke(relayed.error)
                return relayed
            if verdict.action == FINISH:
                return await self._finish(relayed.tally, verdict)
            self.broke(relayed.error)
            if verdict.action == END:
                return await self._give_up(relayed, verdict.reason)
            assert verdict.broken is not None
            tries += 1
            try:
                went_on = await self.attempt(relayed.tally, verdict.broken, tries)
            except Refused:
                return await self._give_up(relayed, "refused")
            if went_on is None:
                return await self._give_up(relayed, self.NOWHERE)
            relayed = went_on
            self.count(self.BROKE, "continued")
        return relayed

    async def relay(
        self,
        upstream: UpstreamResponse,
        tally: ResponseTally,
        splice: Splice,
        first: bytes = b"",
        on_first_write: Callable[[], None] | None = None,
    ) -> Relayed:
        """The continuing upstream's stream spliced (`splice`, of the broken stream) into
        the client's, left open if it breaks too (the loop judges it)."""
        return await relay_spliced(
            self.request, self.response, upstream, tally, splice, first, on_first_write,
            self.message(), self.write_timeout_s,
        )  # fmt: skip

    async def _finish(self, tally: ResponseTally, verdict: Verdict) -> Relayed:
        assert verdict.reason is not None
        self.count(verdict.reason, "ended")
        return await finish(self.request, self.response, self.write_timeout_s, self.route,
                            tally, verdict)  # fmt: skip

    async def _give_up(self, relayed: Relayed, reason: str | None) -> Relayed:
        """The explicit error event."""
        reason = reason or "unknown"
        self.count(reason, "ended")
        await give_up(self.request, self.response, self.write_timeout_s, reason, self.message(),
                      self.error_event)  # fmt: skip
        return relayed


def verdict_on(
    config: ContinuationConfig, route: str, body: dict | None, relayed: Relayed, tries: int
) -> Verdict | None:
    """The verdict on a stream broken after `tries` continuations (continuation_verdict.py
    `judge`); None for a whole answer cut short (relay_body closed it: nothing goes on)."""
    if not relayed.streamed:
        return None
    verdict = judge(config, route, body, relayed.tally.kept, tries)
    relayed.tally.engine_error = None  # (an engine's error event: held back, judged)
    return verdict


async def relay_spliced(
    request: web.Request,
    response: web.StreamResponse,
    upstream: UpstreamResponse,
    tally: ResponseTally,
    splice: Splice,
    first: bytes,
    on_first_write: Callable[[], None] | None,
    message: str,
    write_timeout_s: float | None,
) -> Relayed:
    """A continuing upstream's stream spliced (`splice`, of the broken stream) into the
    client's, left open if it breaks too (the caller judges it)."""
    return await relay_body(
        request,
        response,
        SplicedUpstream(upstream, splice),  # type: ignore[arg-type]
        first=splice.feed(first),
        on_first_write=on_first_write,
        broken_message=lambda _exc: message,
        tally=tally,
        write_timeout_s=write_timeout_s,
        end_broken=False,
    )


async def finish(
    request: web.Request,
    response: web.StreamResponse,
    write_timeout_s: float | None,
    route: str,
    tally: ResponseTally,
    verdict: Verdict,
) -> Relayed:
    """A stream whose upstream broke after its last token: its finish (`length` where its
    cap was spent and none came) and [DONE], as the engine would have ended it."""
    assert verdict.broken is not None
    reason = None if verdict.broken.finished else "length"
    last = finish_events(verdict.broken, route, reason)
    client = ClientWriter(request, response, write_timeout_s)
    return await end(client, tally, True, last)


async def give_up(
    request: web.Request,
    response: web.StreamResponse,
    write_timeout_s: float | None,
    reason: str,
    message: str,
    error_event: Callable[[str], bytes] | None,
) -> None:
    """A broken stream that does not go on ends with the explicit error event."""
    log.info("stream not continued (%s): %s", reason, message)
    client = ClientWriter(request, response, write_timeout_s)
    await end_truncated(request, client, True, message, error_event)
