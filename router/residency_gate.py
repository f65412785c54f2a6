"""The regional end of the global tier's residency decision: verify the signed header and
refuse a request whose decision excludes this router's region (403), or, when the router
serves only traffic from the global tier, a request that carries no decision at all."""

from __future__ import annotations

import time
from collections.abc import Callable

from aiohttp import web

from gpuroute.openai_api import Rejection
from gpuroute.residency_decision import HEADER, DecisionError, verify


class ResidencyGate:
    def __init__(
        self,
        key: str | None,
        required: bool,
        place: frozenset[str],
        clock: Callable[[], float] = time.time,  # wall clock: the expiry crosses machines
    ) -> None:
        self.key = None if key is None else key.encode()
        self.required, self.place, self.clock = required, place, clock

    def check(self, request: web.Request) -> None:
        """Rejection (403) unless the request may be served here."""
        if self.key is None:
            return
        value = request.headers.get(HEADER)
        if value is None:
            if self.required:
                raise Rejection(
                    403, "this router serves requests from the global tier only",
                    code="global_decision_required",
                )  # fmt: skip
            return
        try:
            allowed = verify(value, self.key, self.clock())
        except DecisionError as exc:
            raise Rejection(403, str(exc), code="invalid_residency_decision") from None
        if allowed is not None and allowed.isdisjoint(self.place):
            raise Rejection(
                403,
                f"residency allows {', '.join(sorted(allowed))}; this router is in "
                f"{', '.join(sorted(self.place))}",
                code="residency_violation",
            )
