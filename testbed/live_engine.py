"""The engine model run against the wall clock, for the fake engine server.

The model is sans-IO and event-driven; this shell keeps one timer armed at the model's next
event and turns prefill completion and request completion into asyncio futures that the
HTTP handlers await. Token pacing for streams reads the model's token clock directly."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence

from gpuroute.sim.engine_model import EngineModel, EngineRequest

from gpuroute.roofline import EngineParams


class LiveRequest:
    __slots__ = ("done", "first_token", "request")

    def __init__(self, request: EngineRequest, loop: asyncio.AbstractEventLoop) -> None:
        self.request = request
        self.first_token: asyncio.Future[None] = loop.create_future()
        self.done: asyncio.Future[None] = loop.create_future()


class LiveEngine:
    def __init__(self, params: EngineParams, *, prefix_caching: bool = True) -> None:
        self.model = EngineModel(params, prefix_caching=prefix_caching)
        self._loop = asyncio.get_running_loop()
        self._t0 = self._loop.time()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._live: dict[int, LiveRequest] = {}
        self._ids = itertools.count()
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.finished_total = 0

    def now(self) -> float:
        return self._loop.time() - self._t0

    def submit(
        self, prompt_tokens: int, output_tokens: int, blocks: Sequence[int] = ()
    ) -> LiveRequest:
        """Queue a request; raises ValueError when it can never fit in the KV cache."""
        now = self.now()
        req = EngineRequest(next(self._ids), prompt_tokens, output_tokens, now, blocks)
        if not self.model.fits(req):
            raise ValueError(
                f"request needs {prompt_tokens + req.output_tokens} tokens of KV cache; "
                f"this engine holds {self.model.kv_capacity}"
            )
        live = LiveRequest(req, self._loop)
        self._live[req.rid] = live
        self._step(now, lambda: self.model.submit(req, now))
        self.prompt_tokens_total += prompt_tokens
        return live

    def tokens_generated(self, live: LiveRequest) -> int:
        return self.model.tokens_generated(live.request, self.now())

    def cancel(self, live: LiveRequest) -> None:
        """The client went away: the request is aborted in the model (its batch slot and
        KV cache freed, as vLLM does), its tokens so far counted as generated."""
        if self._live.pop(live.request.rid, None) is None:
            return
        now = self.now()
        generated = self.tokens_generated(live)
        prefilling = self.model.prefilling
        if self.model.abort(live.request, now):
            self.generation_tokens_total += generated
            self._after(prefilling if prefilling is not live.request else None)

    def set_slowdown(self, factor: float) -> None:
        now = self.now()
        self._step(now, lambda: self.model.set_slowdown(factor, now))

    # -- internals -------------------------------------------------------------------------
    def _step(self, now: float, change) -> None:
        prefilling = self.model.prefilling
        change()
        self._after(prefilling)

    def _on_timer(self) -> None:
        self._timer = None
        now = max(self.now(), self._timer_at)  # the loop may fire a hair early
        prefilling = self.model.prefilling
        finished = self.model.on_event(now)
        for req in finished:
            self.generation_tokens_total += req.output_tokens
            self.finished_total += 1
            live = self._live.pop(req.rid, None)
            if live is not None:
                if not live.first_token.done():
                    live.first_token.set_result(None)
                live.done.set_result(None)
        self._after(prefilling)

    def _after(self, was_prefilling: EngineRequest | None) -> None:
        if was_prefilling is not None and was_prefilling.first_token_at >= 0:
            live = self._live.get(was_prefilling.rid)
            if live is not None and not live.first_token.done():
                live.first_token.set_result(None)
        self._arm()

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        t = self.model.next_event_time()
        if t is not None:
            self._timer_at = t
            self._timer = self._loop.call_at(self._t0 + t, self._on_timer)
