"""The outstanding-work ledger: what each backend has been given and not yet finished.

A request's work is added when it is dispatched and removed at end-of-stream (or on error or
client disconnect), never at response headers: the tokens of a stream are the work. The
booking is the request's own (its `RequestLifetime` holds it): the ledger keeps only the
per-backend sums and how many bookings are open."""

from __future__ import annotations

from dataclasses import dataclass

from gpuroute.router.core.backend import Backend


@dataclass(slots=True)
class WorkBooking:
    """One request's work on one backend, until `OutstandingWork.finish`."""

    backend: Backend
    work_s: float
    open: bool = True


class OutstandingWork:
    """Per-backend in-flight count and outstanding GPU-seconds, booked and released."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0  # bookings open

    def __len__(self) -> int:
        return self.count

    def start(self, backend: Backend, work_s: float) -> WorkBooking:
        if work_s < 0:
            raise ValueError(f"work must be >= 0, got {work_s}")
        backend.in_flight += 1
        backend.outstanding += work_s
        self.count += 1
        return WorkBooking(backend, work_s)

    def finish(self, booking: WorkBooking) -> bool:
        """End a booking's work. Idempotent: a second finish (error after disconnect) is
        False and changes nothing."""
        if not booking.open:
            return False
        booking.open = False
        backend = booking.backend
        backend.in_flight -= 1
        # Reset on idle so float rounding cannot accumulate into phantom load.
        backend.outstanding = backend.outstanding - booking.work_s if backend.in_flight else 0.0
        self.count -= 1
        return True
