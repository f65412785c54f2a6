"""Single use of a residency decision's nonce within its validity (pure: `now` is given).

A decision captured on the global tier → router hop must not be sent again. Each nonce is
kept until its decision expires, then forgotten: memory is bounded by the requests that
arrive within one validity window, and nothing is dropped early (which would reopen the
replay)."""

from __future__ import annotations

from collections import deque


class ReplayGuard:
    __slots__ = ("_by_arrival", "_seen")

    def __init__(self) -> None:
        self._seen: dict[str, float] = {}  # nonce -> when its decision expires
        self._by_arrival: deque[tuple[float, str]] = deque()

    def __len__(self) -> int:
        return len(self._seen)

    def first_use(self, nonce: str, expires: float, now: float) -> bool:
        """True the first time `nonce` is seen before `expires`; False for a replay."""
        self._forget_expired(now)
        known = self._seen.get(nonce)
        if known is not None and known >= now:
            return False
        self._seen[nonce] = expires
        self._by_arrival.append((expires, nonce))
        return True

    def _forget_expired(self, now: float) -> None:
        """Expiries arrive nearly in order (each is signed `now + ttl`); one that expires
        later than the entries behind it holds them a little longer, never too short."""
        queue, seen = self._by_arrival, self._seen
        while queue and queue[0][0] < now:
            expires, nonce = queue.popleft()
            if seen.get(nonce) == expires:  # not since renewed
                del seen[nonce]
