"""The access log: one line per answered request, on the `gpuroute.access` logger, for the
router and the global tier. Under heavy traffic it is sampled, so that logging can never
cost more than a bounded number of lines per second however busy the tier is.

The rule (docs/operations.md, "Access log"): the rate is the larger of the requests
answered in the previous second and those answered so far in this one. At or below
`sample_above_rps` every request is written; above it, each is written with probability
`sample_above_rps / rate`, so about `sample_above_rps` lines a second are written. Every
line carries that probability as `sample_rate`: summing `1 / sample_rate` over the lines
counts the requests."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any

from pydantic import Field

from gpuroute.config import StrictModel

ACCESS_LOGGER = logging.getLogger("gpuroute.access")


class AccessLogConfig(StrictModel):
    enabled: bool = True
    # every request is logged below this many answered a second; above, a sample this size
    sample_above_rps: float = Field(default=50.0, gt=0)


class Sampler:
    """Decides, per answered request, whether its line is written (the rule above). The
    clock and the random draw are injected so that tests can replay a rate exactly."""

    __slots__ = ("_clock", "_count", "_previous", "_random", "_start", "limit")

    def __init__(
        self,
        limit: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.limit = limit
        self._clock, self._random = clock, rng
        self._start = clock()
        self._count = 0  # answered in the current second
        self._previous = 0  # answered in the second before it

    def take(self) -> float | None:
        """The probability this request's line is written with, or None: not written."""
        now = self._clock()
        if now - self._start >= 1.0:
            # a gap of a whole second or more: the second before this one was idle
            self._previous = self._count if now - self._start < 2.0 else 0
            self._count = 0
            self._start = now
        self._count += 1
        rate = max(self._previous, self._count)
        if rate <= self.limit:
            return 1.0
        chance = self.limit / rate
        return chance if self._random() < chance else None


def ms(seconds: float | None) -> float | None:
    """Seconds as milliseconds, to the microsecond (None stays None)."""
    return None if seconds is None else round(seconds * 1000, 3)


class AccessLog:
    """Writes one answered request's fields, if its line is sampled and INFO is on."""

    __slots__ = ("enabled", "logger", "sampler")

    def __init__(
        self,
        config: AccessLogConfig,
        *,
        logger: logging.Logger = ACCESS_LOGGER,
        clock: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.enabled, self.logger = config.enabled, logger
        self.sampler = Sampler(config.sample_above_rps, clock=clock, rng=rng)

    def sample(self) -> float | None:
        """The line's sample rate when it is to be written, else None (checked before any
        field is gathered: a request not logged costs a clock read and a draw at most)."""
        if not self.enabled or not self.logger.isEnabledFor(logging.INFO):
            return None
        return self.sampler.take()

    def write(self, fields: dict[str, Any]) -> None:
        """The line: `POST /v1/chat/completions 200`, and the fields (keys of a JSON line;
        `key=value` after the message of a text one: gpuroute/logs.py)."""
        method, route, status = (
            fields.get("method", "POST"),
            fields.get("route"),
            fields.get("status"),
        )
        self.logger.info("%s %s %s", method, route, status, extra=fields)
