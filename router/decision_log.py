"""The sampled, structured decision log: one JSON object per pick or failed attempt."""

from __future__ import annotations

import json
import logging
import random
import time

from gpuroute.router.core.backend import Backend
from gpuroute.router.core.request import RequestInfo
from gpuroute.router.core.scheduler import Scheduler

decisions = logging.getLogger("gpuroute.decisions")


class DecisionLog:
    def __init__(self, sample: float, policy: str, scheduler: Scheduler, rng: random.Random):
        self.sample, self.policy, self.scheduler, self.rng = sample, policy, scheduler, rng

    def decision(self, info: RequestInfo, chosen: Backend, attempt: int, now: float) -> None:
        if not self.sample or self.rng.random() >= self.sample:
            return
        scores = self.scheduler.explain(info, now, self.rng)
        event = {
            "event": "decision",
            "ts": time.time(),
            "request_id": info.request_id,
            "model": info.model,
            "prompt_tokens": info.prompt_tokens,
            "policy": self.policy,
            "attempt": attempt,
            "candidates": [{"backend": b, "score": s} for b, s in scores],
            "chosen": chosen.backend_id,
            "reason": "retry" if attempt else "policy",
        }
        decisions.info(json.dumps(event))

    def failure(self, request_id: object, backend: Backend, kind: str) -> None:
        """Failed attempts are logged whenever the log is on (they are rare and telling)."""
        if self.sample:
            event = {"event": "attempt_failed", "ts": time.time(), "request_id": request_id}
            decisions.info(json.dumps(event | {"backend": backend.backend_id, "kind": kind}))
