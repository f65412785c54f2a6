"""The outstanding-work ledger: what each backend has been given and not yet finished.

A request's work is added when it is dispatched and removed at end-of-stream (or on error or
client disconnect), never at response headers: the tokens of a stream are the work."""

from __future__ import annotations

from gpuroute.router.core.backend import Backend


class OutstandingWork:
    """Tracks per-backend in-flight count and outstanding GPU-seconds by request id."""

    __slots__ = ("_active",)

    def __init__(self) -> None:
        self._active: dict[object, tuple[Backend, float]] = {}

    def __len__(self) -> int:
        return len(self._active)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._active

    def start(self, request_id: object, backend: Backend, work_s: float) -> None:
        if request_id in self._active:
            raise ValueError(f"request {request_id!r} is already outstanding")
        if work_s < 0:
            raise ValueError(f"work must be >= 0, got {work_s}")
        self._active[request_id] = (backend, work_s)
        backend.in_flight += 1
        backend.outstanding += work_s

    def finish(self, request_id: object) -> tuple[Backend, float] | None:
        """End a request's work. Idempotent: a second finish (error after disconnect) is None."""
        entry = self._active.pop(request_id, None)
        if entry is None:
            return None
        backend, work_s = entry
        backend.in_flight -= 1
        # Reset on idle so float rounding cannot accumulate into phantom load.
        backend.outstanding = backend.outstanding - work_s if backend.in_flight else 0.0
        return entry
