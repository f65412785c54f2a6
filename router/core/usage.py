"""Per-tenant usage for billing, sans IO: what each request used, summed per (UTC hour,
tenant, model). Tenants keep their real names here (billing needs every one; only the
metric label is folded into `other`). The shell (router/usage/records.py) feeds requests
in with the wall clock's `now` and keeps the table in Redis or in the process."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

MEASURES = ("requests", "errors", "prompt_tokens", "completion_tokens")
HOUR_S = 3600
UNITS_S = {"m": 60, "h": HOUR_S, "d": 24 * HOUR_S, "w": 7 * 24 * HOUR_S}
RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([mhdw])$")
Cell = tuple[str, str]  # (tenant, model)
Row = tuple[str, str, Sequence[int]]  # tenant, model, counts in MEASURES order


def hour_of(now: float) -> int:
    """Hours since the epoch (UTC): the bucket a request ending at `now` is counted in."""
    return int(now // HOUR_S)


def hour_label(hour: int) -> str:
    """`YYYYMMDDHH` (UTC): how an hour is named in Redis keys."""
    return datetime.fromtimestamp(hour * HOUR_S, UTC).strftime("%Y%m%d%H")


def iso(hour: int) -> str:
    return datetime.fromtimestamp(hour * HOUR_S, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def oldest_kept(now: float, retention_s: float) -> int:
    """The oldest hour still kept at `now`: an hour is kept until `retention_s` after it ended."""
    return hour_of(now - retention_s)


class UsageHours:
    """Counts by hour and (tenant, model): a replica's increments not yet in Redis, or
    without Redis the replica's whole record."""

    __slots__ = ("hours",)

    def __init__(self) -> None:
        self.hours: dict[int, dict[Cell, list[int]]] = {}

    def __len__(self) -> int:
        """Cells held: (hour, tenant, model) combinations."""
        return sum(len(cells) for cells in self.hours.values())

    def add(self, hour: int, tenant: str, model: str, counts: Sequence[int]) -> None:
        cells = self.hours.setdefault(hour, {})
        cell = cells.get((tenant, model))
        if cell is None:
            cells[(tenant, model)] = list(counts)
        else:
            for i, n in enumerate(counts):
                cell[i] += n

    def record(
        self, now: float, tenant: str, model: str, prompt: int, completion: int, error: bool
    ) -> None:
        """One request that ended at `now`, with the tokens its engine reported."""
        self.add(hour_of(now), tenant, model, (1, int(error), prompt, completion))

    def take(self, limit: int) -> UsageHours:
        """Up to `limit` cells moved out, oldest hours first (one bounded flush to Redis)."""
        taken = UsageHours()
        for hour in sorted(self.hours):
            cells = self.hours[hour]
            while cells and limit > 0:
                cell = next(iter(cells))
                taken.hours.setdefault(hour, {})[cell] = cells.pop(cell)
                limit -= 1
            if not cells:
                del self.hours[hour]
            if limit <= 0:
                break
        return taken

    def prune(self, oldest: int) -> int:
        """Hours before `oldest` dropped; returns how many cells went with them."""
        old = [hour for hour in self.hours if hour < oldest]
        return sum(len(self.hours.pop(hour)) for hour in old)

    def rows(self, first: int, end: int) -> Iterator[Row]:
        """Every cell of the hours in [first, end)."""
        for hour, cells in self.hours.items():
            if first <= hour < end:
                for (tenant, model), counts in cells.items():
                    yield tenant, model, counts


def parse_instant(text: str, now: float) -> float:
    """A point in time from ISO 8601 (`2026-11-26T10:00:00Z`, `2026-11-26`; UTC unless it
    names an offset), a time before `now` (`90m`, `24h`, `7d`, `2w`), or `now`; ValueError
    saying what is accepted."""
    text = text.strip()
    if text == "now":
        return now
    if match := RELATIVE.match(text):
        return now - float(match[1]) * UNITS_S[match[2]]
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{text[:64]!r} is not a time: expected ISO 8601 (2026-11-26T10:00:00Z, "
            "2026-11-26) or a time ago (90m, 24h, 7d, 2w)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


@dataclass(frozen=True, slots=True)
class Window:
    """Whole hours [first, end): `since` rounded down to its hour and `until` up, within
    what retention keeps and no later than the current hour."""

    first: int
    end: int

    @classmethod
    def of(cls, since: float, until: float, now: float, retention_s: float) -> Window:
        if until <= since:
            raise ValueError("until must be after since")
        first = max(hour_of(since), oldest_kept(now, retention_s))
        end = min(math.ceil(until / HOUR_S), hour_of(now) + 1)
        return cls(first, max(first, end))

    def hours(self) -> range:
        return range(self.first, self.end)

    def echo(self) -> dict[str, str]:
        return {"since": iso(self.first), "until": iso(self.end)}


def named(counts: Sequence[int]) -> dict[str, int]:
    return dict(zip(MEASURES, counts, strict=True))


def usage_sums(rows: Iterable[Row], tenant: str | None = None, model: str | None = None) -> dict:
    """Per tenant, and per model within it, the sums of `rows` (those of `tenant` and
    `model` where given), and the total over all of them."""
    tenants: dict[str, dict[str, list[int]]] = {}
    total = [0] * len(MEASURES)
    for t, m, counts in rows:
        if (tenant is not None and t != tenant) or (model is not None and m != model):
            continue
        cell = tenants.setdefault(t, {}).setdefault(m, [0] * len(MEASURES))
        for i, n in enumerate(counts):
            cell[i] += n
            total[i] += n
    body = {}
    for t in sorted(tenants):
        models = tenants[t]
        sums = [sum(col) for col in zip(*models.values(), strict=True)]
        body[t] = {**named(sums), "models": {m: named(models[m]) for m in sorted(models)}}
    return {"tenants": body, "total": named(total)}


def rows_of(answer: dict) -> Iterator[Row]:
    """The (tenant, model, counts) rows an answer of `usage_sums` was made of."""
    for tenant, sums in answer.get("tenants", {}).items():
        for model, counts in sums.get("models", {}).items():
            yield tenant, model, [int(counts.get(k, 0)) for k in MEASURES]
