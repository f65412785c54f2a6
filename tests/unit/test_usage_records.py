"""Per-tenant usage records (issue 34 item 2), without Redis: hour bucketing on an injected
wall clock, what a flush takes, retention pruning, the window's rounding,
the sums' shape, and a failed flush to Redis keeping every count for the next one."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
import pytest
from aiohttp.test_utils import make_mocked_request
from gpuroute.router.config.usage import UsageConfig
from gpuroute.router.core.usage import (
    UsageHours,
    Window,
    hour_label,
    hour_of,
    oldest_kept,
    parse_instant,
    rows_of,
    usage_sums,
)
from gpuroute.router.observe.metrics import RouterMetrics
from gpuroute.router.usage.records import UsageRecords, field, parse_field
from gpuroute.router.workers.admin import merge_usage
from redis.exceptions import ConnectionError as RedisConnectionError


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


H10 = hour_of(at("2026-11-26T10:00:00"))


class Wall:
    def __init__(self, text: str) -> None:
        self.now = at(text)

    def __call__(self) -> float:
        return self.now


def test_requests_are_counted_in_the_utc_hour_they_end() -> None:
    hours = UsageHours()
    hours.record(at("2026-11-26T10:00:00"), "acme", "m", 10, 2, False)
    hours.record(at("2026-11-26T10:59:59.999"), "acme", "m", 5, 1, True)
    hours.record(at("2026-11-26T11:00:00"), "acme", "m", 7, 3, False)
    hours.record(at("2026-11-26T10:30:00"), "beta", "m", 1, 1, False)
    assert hours.hours == {
        H10: {("acme", "m"): [2, 1, 15, 3], ("beta", "m"): [1, 0, 1, 1]},
        H10 + 1: {("acme", "m"): [1, 0, 7, 3]},
    }
    assert len(hours) == 3
    assert hour_label(H10) == "2026112610"


def test_take_moves_a_bounded_batch_oldest_first() -> None:
    hours = UsageHours()
    for i, tenant in enumerate(("a", "b", "c")):
        hours.add(H10 + 1, tenant, "m", [1, 0, i, 0])
    hours.add(H10, "z", "m", [1, 0, 9, 9])
    batch = hours.take(2)
    assert batch.hours == {H10: {("z", "m"): [1, 0, 9, 9]}, H10 + 1: {("a", "m"): [1, 0, 0, 0]}}
    assert hours.hours == {H10 + 1: {("b", "m"): [1, 0, 1, 0], ("c", "m"): [1, 0, 2, 0]}}
    assert not hours.take(0).hours and len(hours.take(10)) == 2 and not hours.hours


def test_an_hour_is_kept_until_retention_after_it_ended() -> None:
    day = 86_400.0
    # 10:00-11:00 ends at 11:00; kept through 11:00 + 1 day, gone after
    assert oldest_kept(at("2026-11-27T10:59:59"), day) == H10
    assert oldest_kept(at("2026-11-27T11:00:00"), day) == H10 + 1
    hours = UsageHours()
    hours.add(H10, "a", "m", [1, 0, 0, 0])
    hours.add(H10 + 1, "a", "m", [1, 0, 0, 0])
    hours.add(H10 + 1, "b", "m", [1, 0, 0, 0])
    assert hours.prune(H10) == 0 and hours.prune(H10 + 1) == 1
    assert list(hours.hours) == [H10 + 1] and hours.prune(H10 + 5) == 2 and not hours.hours


def test_times_iso_relative_and_refused() -> None:
    now = at("2026-11-26T10:30:00")
    assert parse_instant("2026-11-26T08:00:00Z", now) == at("2026-11-26T08:00:00")
    assert parse_instant("2026-11-26T10:00:00+02:00", now) == at("2026-11-26T08:00:00")
    assert parse_instant("2026-11-26", now) == at("2026-11-26T00:00:00")  # naive: UTC
    assert parse_instant("24h", now) == now - 86_400
    assert parse_instant("7d", now) == now - 7 * 86_400
    assert parse_instant("90m", now) == now - 5400
    assert parse_instant("2w", now) == now - 14 * 86_400
    assert parse_instant("now", now) == now
    for bad in ("yesterday", "-1h", "7 days", "", "2026-13-01"):
        with pytest.raises(ValueError, match="expected ISO 8601"):
            parse_instant(bad, now)


def test_a_window_is_whole_hours_within_retention_and_not_past_this_hour() -> None:
    now, year = at("2026-11-26T10:30:00"), 365 * 86_400.0
    window = Window.of(at("2026-11-26T08:15:00"), at("2026-11-26T09:00:01"), now, year)
    assert (window.first, window.end) == (H10 - 2, H10)
    assert window.echo() == {"since": "2026-11-26T08:00:00Z", "until": "2026-11-26T10:00:00Z"}
    assert Window.of(now - 3600, now + 10 * 3600, now, year).end == H10 + 1  # this hour last
    clamped = Window.of(0.0, now, now, 86_400.0)  # nothing older than a day exists
    assert (clamped.first, clamped.end) == (H10 - 24, H10 + 1)
    with pytest.raises(ValueError, match="until must be after since"):
        Window.of(now, now, now, year)


def test_sums_per_tenant_and_model_filtered_and_merged() -> None:
    rows = [
        ("acme", "m1", [2, 0, 10, 4]),
        ("acme", "m2", [1, 1, 3, 0]),
        ("acme", "m1", [1, 0, 5, 5]),  # another hour
        ("beta", "m1", [4, 0, 8, 8]),
    ]
    sums = usage_sums(rows)
    assert sums == {
        "tenants": {
            "acme": {
                "requests": 4, "errors": 1, "prompt_tokens": 18, "completion_tokens": 9,
                "models": {
                    "m1": {"requests": 3, "errors": 0, "prompt_tokens": 15, "completion_tokens": 9},
                    "m2": {"requests": 1, "errors": 1, "prompt_tokens": 3, "completion_tokens": 0},
                },
            },
            "beta": {
                "requests": 4, "errors": 0, "prompt_tokens": 8, "completion_tokens": 8,
                "models": {
                    "m1": {"requests": 4, "errors": 0, "prompt_tokens": 8, "completion_tokens": 8},
                },
            },
        },
        "total": {"requests": 8, "errors": 1, "prompt_tokens": 26, "completion_tokens": 17},
    }  # fmt: skip
    assert usage_sums(rows, model="m2")["total"]["requests"] == 1
    assert list(usage_sums(rows, tenant="beta")["tenants"]) == ["beta"]
    assert usage_sums(rows, tenant="nobody") == {"tenants": {}, "total": usage_sums([])["total"]}
    assert usage_sums(rows_of(sums)) == sums
    # workers without Redis: their answers summed, the first's window kept
    head = {"since": "s", "until": "u", "shared": False, "tenant": None, "model": None}
    merged = merge_usage([head | sums, head | usage_sums(rows[:1])])
    assert merged["since"] == "s" and merged["total"]["requests"] == 10
    assert merged["tenants"]["acme"]["models"]["m1"]["prompt_tokens"] == 25


def test_fields_carry_any_tenant_name() -> None:
    for tenant in ("acme", 'a:b"c\x1fd', "ünï [bold]x[/bold]", ""):
        assert parse_field(field(tenant, "m:1", "requests").encode()) == (tenant, "m:1", "requests")
    assert parse_field(b"acme:m:requests") is None
    assert parse_field(b'["a","m","unknown"]') is None and parse_field(b'["a","m"]') is None


def records(wall: Wall, redis=None, **config) -> UsageRecords:
    return UsageRecords(UsageConfig(**config), redis, RouterMetrics(), prefix="t", wall=wall)


def sample(usage: UsageRecords, name: str) -> float | None:
    return usage.metrics.registry.get_sample_value(name)


async def answer(usage: UsageRecords, query: str) -> tuple[int, dict]:
    response = await usage.get(make_mocked_request("GET", "/admin/usage?" + query))
    return response.status, orjson.loads(response.body)


@pytest.mark.asyncio
async def test_without_redis_the_replica_keeps_and_answers_its_own_record() -> None:
    wall = Wall("2026-11-26T10:10:00")
    usage = records(wall, retention_days=1)
    usage.record("acme", "m", 10, 2, False)
    usage.record("anonymous", "m", 3, 0, True)
    usage.record("acme", "", 99, 99, False)  # a passthrough path: no model, not recorded
    wall.now = at("2026-11-26T11:05:00")
    usage.record("acme", "m", 1, 1, False)
    status, body = await answer(usage, "since=2026-11-26T10:00:00Z&until=2026-11-26T11:00:00Z")
    assert status == 200 and body["shared"] is False
    assert (body["since"], body["until"]) == ("2026-11-26T10:00:00Z", "2026-11-26T11:00:00Z")
    assert body["tenants"]["acme"]["prompt_tokens"] == 10
    assert body["tenants"]["anonymous"]["errors"] == 1
    assert (await answer(usage, "since=2h"))[1]["total"]["requests"] == 3
    assert (await answer(usage, "since=2h&tenant=acme"))[1]["total"]["requests"] == 2
    wall.now = at("2026-11-27T11:00:00")  # a day after 10:00-11:00 ended
    await usage.flush()  # prunes
    assert list(usage.counted.hours) == [H10 + 1] and usage.unflushed == 0
    assert sample(usage, "gpuroute_usage_dropped_cells_total") == 0  # retention, not a loss


@pytest.mark.asyncio
async def test_a_bad_window_is_a_400_naming_the_parameter() -> None:
    usage = records(Wall("2026-11-26T10:10:00"))
    for query, param, says in (
        ("", "since", "since is required"),
        ("since=yesterday", "since", "since: 'yesterday' is not a time: expected ISO 8601"),
        ("since=1h&until=soon", "until", "until: 'soon' is not a time"),
        ("since=1h&until=2h", "until", "until must be after since"),
    ):
        status, body = await answer(usage, query)
        assert status == 400, query
        error = body["error"]
        assert error["param"] == param and error["code"] == "invalid_usage_window"
        assert error["message"].startswith(says), error


class BrokenRedis:
    """A Redis that cannot be reached: every script call fails."""

    def __init__(self) -> None:
        self.calls = 0

    def register_script(self, _lua: str):
        async def script(**_kwargs):
            self.calls += 1
            raise RedisConnectionError("Connection refused")

        return script


@pytest.mark.asyncio
async def test_a_failed_flush_keeps_every_count_for_the_next_one() -> None:
    wall, redis = Wall("2026-11-26T10:10:00"), BrokenRedis()
    usage = records(wall, redis, retention_days=1)
    usage.batch_cells = 1
    usage.record("acme", "m", 10, 2, False)
    usage.record("beta", "m", 1, 1, False)
    assert not await usage.flush_logged() and redis.calls == 1
    assert usage.unflushed == 2 and sample(usage, "gpuroute_usage_unflushed_cells") == 2
    batch_id, in_doubt = usage.in_doubt  # the batch that was sent is sent again, as it was
    assert in_doubt.hours == {H10: {("acme", "m"): [1, 0, 10, 2]}}
    usage.record("acme", "m", 5, 5, False)  # counted meanwhile: waits in the table
    assert not await usage.flush_logged() and redis.calls == 2
    assert usage.in_doubt[0] == batch_id and usage.in_doubt[1].hours == in_doubt.hours
    waiting = {("beta", "m"): [1, 0, 1, 1], ("acme", "m"): [1, 0, 5, 5]}
    assert usage.counted.hours == {H10: waiting}
    assert sample(usage, "gpuroute_usage_flush_failures_total") == 2
    status, body = await answer(usage, "since=1h")
    assert status == 503 and body["error"]["code"] == "usage_unavailable"
    wall.now = at("2026-11-27T11:00:00")  # Redis away for longer than the retention
    assert await usage.flush_logged() and redis.calls == 3  # nothing left to send
    assert (
        usage.unflushed == 0
        and usage.in_doubt is None
        and sample(usage, "gpuroute_usage_dropped_cells_total") == 3
    )
