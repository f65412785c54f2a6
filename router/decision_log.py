"""The sampled, structured decision log: one JSON object per pick or failed attempt.

It samples with its own RNG (turning it on must not change which backends are picked) and
logs the scores the scheduler saw before booking the request (`Scheduler.route(explain=)`)."""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable

from gpuroute.router.core.backend import Backend
from gpuroute.router.core.request import RequestInfo
from gpuroute.router.core.scheduler import Decision

decisions = logging.getLogger("gpuroute.decisions")


class DecisionLog:
    def __init__(
        self,
        sample: float,
        policy: str,
        *,
        rng: random.Random | None = None,
        emit: Callable[[str], None] = decisions.info,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.sample, self.policy = sample, policy
        self.rng = rng or random.Random()
        self.emit, self.wall_clock = emit, wall_clock

    def wants_next(self) -> bool:
        """Should the next pick be explained? (Asked before routing, so scores are pre-booking.)"""
        return bool(self.sample) and self.rng.random() < self.sample

    def decision(self, info: RequestInfo, decision: Decision, attempt: int) -> None:
        if decision.scores is None:
            return
        event = {
            "event": "decision",
            "ts": self.wall_clock(),
            "request_id": info.request_id,
            "model": info.model,
            "prompt_tokens": info.prompt_tokens,
            "policy": self.policy,
            "attempt": attempt,
            "reason": decision.reason.value,
            "candidates": [{"backend": b, "score": s} for b, s in decision.scores],
            "chosen": decision.backend.backend_id,
            "slo_class": info.slo.name if info.slo is not None else None,
            "fits_slo": decision.fits,
        }
        if decision.prediction is not None:
            event["predicted_ttft_s"] = round(decision.prediction.ttft_s, 4)
            event["predicted_tpot_s"] = round(decision.prediction.tpot_s, 5)
        self.emit(json.dumps(event))

    def failure(self, request_id: object, backend: Backend, kind: str) -> None:
        """Failed attempts are logged whenever the log is on (they are rare and telling)."""
        if self.sample:
            event = {"event": "attempt_failed", "ts": self.wall_clock(), "request_id": request_id}
            self.emit(json.dumps(event | {"backend": backend.backend_id, "kind": kind}))
