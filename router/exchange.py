"""One client request on its way through the forwarder's attempts."""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web
from gpuroute.router.core.backend import Backend
from gpuroute.router.core.request import RequestInfo


@dataclass(slots=True)
class Exchange:
    """One client request on its way through the attempts: what every attempt sends, and
    what the answer is measured against."""

    request: web.Request
    info: RequestInfo
    raw: bytes
    route: str
    arrival: float
    headers: dict[str, str]  # forwarded upstream, the same every attempt
    # backends that answered this request with a 5xx: judged only once another backend
    # answers it below 500 (a request that breaks every engine is the client's doing)
    suspects: list[Backend] = field(default_factory=list)
    dispatched: float = 0.0  # when the current attempt was sent
    first_at: float | None = None  # when its first bytes reached the client
    used_tokens: int | None = None  # what the answer cost (usage, or a stream's estimate)
