"""What each request adds to the router's request metrics, by route and by the model that
served it (a refused one: the model it asked for), each model label bounded
(router/config/metrics.py): its count and duration, its first byte and first token, a
stream's inter-token latency, and the latency of the backend that answered it."""

from __future__ import annotations

import collections
from collections.abc import Callable

from aiohttp import web
from gpuroute.router.attempts.exchange import Exchange
from gpuroute.router.core.slo import time_per_output_token
from gpuroute.router.front.stages import MODEL_ASKED
from gpuroute.router.observe.access import ENDED
from gpuroute.router.observe.metrics import RouterMetrics
from gpuroute.router.observe.tracing_spans import first_token

from gpuroute.relay.body import ResponseTally


def model_of(request: web.Request) -> str:
    """The model an answered request is counted under: the one that served it once it was
    admitted, else the one it asked for ("" when refused before it named one)."""
    ended = request.get(ENDED)
    if ended is not None:
        return ended.admitted.life.model
    return request.get(MODEL_ASKED, "")


class RequestMetrics:
    """The request path's hooks into RouterMetrics (Proxy and Forwarder call them)."""

    __slots__ = ("clock", "label", "metrics", "recent_e2e", "recent_ttft")

    def __init__(self, metrics: RouterMetrics, clock: Callable[[], float]) -> None:
        self.metrics, self.clock = metrics, clock
        self.label = metrics.model_label
        # the last completions, for the region report's recent p99s
        self.recent_ttft: collections.deque[float] = collections.deque(maxlen=2000)
        self.recent_e2e: collections.deque[float] = collections.deque(maxlen=2000)

    def answered(self, request: web.Request, route: str, status: int, elapsed: float) -> None:
        model = self.label(model_of(request))
        self.metrics.requests_by(route, model, str(status)).inc()
        self.metrics.duration_by(route, model).observe(elapsed)
        if status == 200:
            self.recent_e2e.append(elapsed)

    def first_byte(self, exchange: Exchange, tally: ResponseTally, streamed: bool) -> None:
        """Its first bytes reached the client (`exchange.first_at`). They are its first token
        when it is a whole answer, or a stream whose first chunk carried text already."""
        at = exchange.first_at
        assert at is not None
        ttft = at - exchange.arrival
        self.metrics.ttft_by(exchange.route, self.label(exchange.life.model)).observe(ttft)
        self.recent_ttft.append(ttft)
        if not streamed or tally.content:
            tally.on_text = None
            self._first_token(exchange, at)

    def time_text(self, exchange: Exchange, tally: ResponseTally) -> None:
        """A stream's first token: the first chunk with text after its first bytes were
        written (text in those is timed by `first_byte`), timed as it is passed on to the
        client; a clock read on that chunk only."""

        def text() -> None:
            if exchange.first_at is not None:
                tally.on_text = None
                self._first_token(exchange, self.clock())

        tally.on_text = text

    def _first_token(self, exchange: Exchange, at: float, traced: bool = True) -> None:
        """Timed (`traced`: now, so also an event on the attempt's span)."""
        if traced:
            first_token()
        exchange.first_token_at = at
        model = self.label(exchange.life.model)
        self.metrics.first_token_by(exchange.route, model).observe(at - exchange.arrival)

    def relayed(self, exchange: Exchange, backend_id: str, complete: bool) -> None:
        """Its answer relayed (`complete`: to the end). A stream whose text was never seen
        (tool calls only, or text the tally cannot size: gpuroute/relay/body.py) counts its first
        byte as its first token. A complete answer times its backend (dispatch to last
        byte) and, as a stream of 2 or more output tokens (the engine's usage, else the
        tally's estimate), the mean time between them: its end (engines send the finish,
        usage and [DONE] events with the last token) less its first token, over the gaps."""
        if exchange.first_token_at is None and exchange.first_at is not None:
            self._first_token(exchange, exchange.first_at, traced=False)
        answer, first = exchange.answer, exchange.first_token_at
        if not complete or answer is None:
            return
        now = self.clock()
        self.metrics.backend_duration_by(backend_id).observe(now - exchange.dispatched)
        if not answer.streamed or first is None:
            return
        itl = time_per_output_token(first, now, answer.output_tokens())
        if itl is not None:  # 2 tokens or more
            self.metrics.inter_token_by(self.label(exchange.life.model)).observe(itl)
