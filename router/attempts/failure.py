"""How an attempt at a backend failed before anything reached the client, as the retry
core counts it (router/core/retry.py FailureKind)."""

from __future__ import annotations

from gpuroute.router.core.retry import FailureKind

from gpuroute.upstream import ConnectFailed


class UpstreamFailed(Exception):
    def __init__(self, kind: FailureKind, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


def failure_kind(exc: BaseException) -> FailureKind:
    if isinstance(exc, TimeoutError):
        return FailureKind.TIMEOUT
    if isinstance(exc, ConnectFailed):
        if isinstance(exc.cause, ConnectionRefusedError):
            return FailureKind.REFUSED
        return FailureKind.CONNECT
    return FailureKind.CONNECTION
