"""Distances and round-trip estimates between places (pure).

RTT ≈ `RTT_BASE_MS + RTT_MS_PER_KM × great-circle km`: light in fibre takes 1 ms per 100 km
one way (200 km/ms) and real paths are longer than great circles. The two constants are a
least-squares fit to IBM Cloud's published inter-region RTT matrix (../shared/data/
ibm-cloud-rtt; `tests/unit/test_global_core.py` refits them and checks the error), which put
the path inflation at about 1.6x the straight fibre line."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

EARTH_RADIUS_KM = 6371.0
RTT_BASE_MS = 7.4
RTT_MS_PER_KM = 0.0163


@dataclass(frozen=True, slots=True)
class Point:
    lat: float
    lon: float


def great_circle_km(a: Point, b: Point) -> float:
    """Haversine distance."""
    lat1, lon1, lat2, lon2 = map(math.radians, (a.lat, a.lon, b.lat, b.lon))
    h = (
        math.sin((lat2 - lat1) / 2) ** 2
        + math.cos(lat1) * math.cos(lat2) * math.sin((lon2 - lon1) / 2) ** 2
    )
    return 2 * EARTH_RADIUS_KM * math.asin(min(1.0, math.sqrt(h)))


def estimated_rtt_s(a: Point, b: Point) -> float:
    return (RTT_BASE_MS + RTT_MS_PER_KM * great_circle_km(a, b)) / 1000.0


def fit_rtt(samples: Iterable[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (base_ms, ms_per_km) from (distance_km, rtt_ms) pairs."""
    pts: Sequence[tuple[float, float]] = list(samples)
    n = len(pts)
    if n < 2:
        raise ValueError("need at least two samples")
    mx = sum(d for d, _ in pts) / n
    my = sum(r for _, r in pts) / n
    sxx = sum((d - mx) ** 2 for d, _ in pts)
    sxy = sum((d - mx) * (r - my) for d, r in pts)
    slope = sxy / sxx
    return my - slope * mx, slope
