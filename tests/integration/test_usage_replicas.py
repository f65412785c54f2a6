"""Per-tenant usage records (issue 34 item 2) with a real redis-server: flushes add to the
hourly hashes (any tenant name, an expiry per hour), a flush that failed goes with the next
one, a batch whose answer was lost is not counted twice, shutting down flushes. Two live
router replicas sharing Redis, behind which two tenants and keyless callers send requests
to fake engines: `/admin/usage` on one replica, and `gpuroute usage --json` against it,
give each tenant exactly the usage the engines reported, summed over both replicas. And
the parent of two workers answers for both, with Redis and without."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import urllib.request

import aiohttp
import pytest
import redis
from aiohttp.test_utils import make_mocked_request
from gpuroute.router.config.usage import UsageConfig
from gpuroute.router.core.usage import hour_label, hour_of
from gpuroute.router.observe.metrics import RouterMetrics
from gpuroute.router.usage.records import UsageRecords, field
from prometheus_client.parser import text_string_to_metric_families
from support.live import (
    MODEL,
    ROUTER_ON_LOOPBACK,
    chat_body,
    environ_without_proxies,
    fake_engines,
    free_port,
    get_json,
    gpuroute_cmd,
    http_ok,
    router_server,
    router_toml,
    shared_redis,
    stopped,
    wait_for,
)
from support.redis_server import RedisServer, client
from support.token_replay import replay_bodies

from gpuroute.auth import key_digest

# each call bounded well inside the test's own timeout, so a call that hangs (seen once
# under a loaded full suite) fails naming itself
CALL_TIMEOUT = aiohttp.ClientTimeout(total=60)

ODD = 'beta "β":\x1fcorp'  # a tenant name with quotes, a colon and the unit separator
KEYS = {"sk-acme": "acme", "sk-beta": ODD}
TOKEN = "usage-admin-token"
PER_TENANT = 24  # requests per tenant (and keyless) on each replica


def recorder(redis, now: float) -> UsageRecords:
    config = UsageConfig(retention_days=2)
    return UsageRecords(config, redis, RouterMetrics(), prefix="t", wall=lambda: now)


async def summed(usage: UsageRecords, query: str = "since=1h") -> dict:
    response = await usage.get(make_mocked_request("GET", "/admin/usage?" + query))
    assert response.status == 200, response.body
    return json.loads(response.body)


@pytest.mark.asyncio
async def test_flushes_reach_redis_once_after_a_failure_and_a_lost_answer(tmp_path) -> None:
    server = RedisServer(tmp_path)  # not started yet: Redis is down
    r = client(server.url, 1.0)
    now = time.time()
    hour = hour_of(now)
    usage = recorder(r, now)
    try:
        usage.record("acme", "m", 10, 2, False)
        usage.record(ODD, "m", 3, 1, True)
        assert not await usage.flush_logged() and usage.unflushed == 2
        server.start()
        usage.record("acme", "m", 5, 5, False)  # counted since: it goes with the batch in doubt
        assert await usage.flush_logged() and usage.unflushed == 0
        key = f"t:usage:{hour_label(hour)}"
        stored = {k.decode(): int(v) for k, v in (await r.hgetall(key)).items()}
        assert stored == {
            field("acme", "m", "requests"): 2,
            field("acme", "m", "prompt_tokens"): 15,
            field("acme", "m", "completion_tokens"): 7,
            field(ODD, "m", "requests"): 1,
            field(ODD, "m", "errors"): 1,
            field(ODD, "m", "prompt_tokens"): 3,
            field(ODD, "m", "completion_tokens"): 1,
        }
        expires = (hour + 1) * 3600 + 2 * 86_400
        assert abs(await r.expiretime(key) - expires) <= 1
        usage.record("acme", "m", 1, 1, False)
        batch = usage.counted.take(10)
        usage.in_doubt = ("lost-answer", batch)
        await usage.flush()  # Redis applied it...
        usage.in_doubt = ("lost-answer", batch)  # ...but the answer never came back
        await usage.flush()  # sent again under its marker: not counted twice
        body = await summed(usage)
        assert body["shared"] is True
        assert body["tenants"]["acme"]["requests"] == 3
        assert body["tenants"]["acme"]["prompt_tokens"] == 16
        assert body["tenants"][ODD]["models"]["m"] == {
            "requests": 1, "errors": 1, "prompt_tokens": 3, "completion_tokens": 1
        }  # fmt: skip
        usage.record("acme", "m", 2, 2, False)
        await usage.close()  # a drain's last flush
        assert (await summed(usage))["tenants"]["acme"]["prompt_tokens"] == 18
    finally:
        await r.aclose()
        server.stop()


@pytest.mark.asyncio
async def test_a_flush_no_replica_acknowledged_is_sent_again_and_counted_once(tmp_path) -> None:
    """`usage.replica_acks`: a batch the primary took but no replica acknowledged (one a
    failover could lose) stays in doubt; once a replica follows, it goes again under its
    marker and the primary, which has it already, counts it once."""
    (tmp_path / "p").mkdir()
    (tmp_path / "r").mkdir()
    primary, replica = RedisServer(tmp_path / "p"), RedisServer(tmp_path / "r")
    primary.start()
    r = client(primary.url, 1.0)
    now = time.time()
    config = UsageConfig(retention_days=2, replica_acks=1)
    usage = UsageRecords(config, r, RouterMetrics(), prefix="t", wall=lambda: now, ack_wait_ms=50)
    key = f"t:usage:{hour_label(hour_of(now))}"
    try:
        usage.record("acme", "m", 10, 2, False)
        assert not await usage.flush_logged() and usage.unflushed == 1
        assert await r.hget(key, field("acme", "m", "requests")) == b"1"  # the primary has it
        replica.start("--replicaof", "127.0.0.1", str(primary.port))
        wait_for(lambda: replica_linked(replica), 10, "the replica to follow the primary")
        assert await usage.flush_logged() and usage.unflushed == 0
        assert await r.hget(key, field("acme", "m", "requests")) == b"1"
        assert await r.hget(key, field("acme", "m", "prompt_tokens")) == b"10"
    finally:
        await r.aclose()
        replica.stop()
        primary.stop()


def replica_linked(replica: RedisServer) -> bool:
    with redis.Redis(port=replica.port, socket_timeout=1.0) as r:
        return r.info("replication").get("master_link_status") == "up"


def replica_toml(engines, redis_url: str) -> str:
    keys = "".join(
        f'[[auth.keys]]\nsha256 = "{key_digest(k)}"\ntenant = {json.dumps(t)}\n'
        for k, t in KEYS.items()
    )
    backends = "".join(
        f'[[backends]]\nurl = "{e.url}"\ngpu = "{e.gpu}"\nmodels = ["{MODEL}"]\n' for e in engines
    )
    return (
        f'admin_token = "{TOKEN}"\ntick_s = 0.05\n[listen]\nport = 0\n[admin_listen]\nport = 0\n'
        f'[redis]\nurl = "{redis_url}"\ntimeout_s = 0.5\n[usage]\nflush_interval_s = 0.2\n'
        # no rescues: an attempt moved off a slow-seeming backend leaves engine-counted
        # work no answer carried, and the total below is compared with the engines' counters
        f"[retry]\nrescue_slowness = 0\n[auth]\nallow_anonymous = true\n{keys}{backends}"
    )


async def send(s: aiohttp.ClientSession, url: str, key: str | None, route: str, body: dict):
    """One request; the usage its answer reported to the client (prompt, completion)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with s.post(url + route, json=body, headers=headers) as r:
        data = await r.read()
    assert r.status == 200, data
    if not body.get("stream"):
        usage = json.loads(data)["usage"]
    else:
        events = [e.removeprefix(b"data: ") for e in data.split(b"\n\n") if e]
        usage = json.loads(events[-2])["usage"]  # the usage chunk before [DONE]
    return usage["prompt_tokens"], usage["completion_tokens"]


def with_usage(item: tuple[str, dict]) -> tuple[str, dict]:
    """Every answer tells the client its usage (a stream: with include_usage)."""
    route, body = item
    if body.get("stream"):
        body = body | {"stream_options": {"include_usage": True}}
    return route, body


async def engines_total(s: aiohttp.ClientSession, engines) -> tuple[float, float]:
    prompt = completion = 0.0
    for engine in engines:
        async with s.get(engine.url + "/metrics") as r:
            for line in (await r.text()).splitlines():
                name, _, value = line.rpartition(" ")
                if name.startswith("vllm:prompt_tokens_total"):
                    prompt += float(value)
                elif name.startswith("vllm:generation_tokens_total"):
                    completion += float(value)
    return prompt, completion


async def drive(urls: list[str]) -> dict[str, list[int]]:
    """PER_TENANT requests per tenant on each replica; each tenant's [requests, prompt,
    completion] as the answers reported them."""
    bodies = [with_usage(b) for b in replay_bodies(PER_TENANT * 3 * len(urls), MODEL)]
    callers = [*KEYS.items(), (None, "anonymous")]
    jobs = [(urls[i % 2], callers[(i // 2) % 3], bodies[i]) for i in range(len(bodies))]
    expected = {tenant: [0, 0, 0] for _, tenant in callers}
    async with aiohttp.ClientSession(timeout=CALL_TIMEOUT) as s:

        async def one(url, caller, item) -> None:
            key, tenant = caller
            prompt, completion = await send(s, url, key, *item)
            for i, n in enumerate((1, prompt, completion)):
                expected[tenant][i] += n

        for start in range(0, len(jobs), 8):
            await asyncio.gather(*(one(*job) for job in jobs[start : start + 8]))
    return expected


def usage_cli(admin: str, *extra: str) -> subprocess.CompletedProcess:
    """`gpuroute usage` as an operator runs it, the admin token from the environment."""
    command = gpuroute_cmd("usage", "--since", "2h", "--admin-url", admin, *extra)
    env = environ_without_proxies() | {"GPUROUTE_ADMIN_TOKEN": TOKEN, "COLUMNS": "200"}
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.asyncio
async def test_one_replica_answers_the_sum_over_both_and_the_cli_prints_it(tmp_path, redis) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with fake_engines(("H100", 0.02), ("A100", 0.02)) as engines:
        config = replica_toml(engines, redis.url)
        async with (
            router_server(config, tmp_path / "a") as a,
            router_server(config, tmp_path / "b") as b,
        ):
            urls = [f"http://127.0.0.1:{x.port}" for x in (a, b)]
            expected = await drive(urls)
            admin = f"http://127.0.0.1:{a.admin_port}"
            async with aiohttp.ClientSession(timeout=CALL_TIMEOUT) as s:
                flush_b = f"http://127.0.0.1:{b.admin_port}/admin/usage/flush"
                async with s.post(
                    flush_b, headers={**auth, "Content-Type": "application/json"}
                ) as r:  # A reads what B counted
                    assert r.status == 200 and (await r.json())["shared"] is True
                async with s.get(admin + "/admin/usage", params={"since": "2h"}) as r:
                    assert r.status == 401  # the admin token is asked for
                async with s.get(admin + "/admin/usage?since=2h", headers=auth) as r:
                    assert r.status == 200
                    body = await r.json()
                engines_prompt, engines_completion = await engines_total(s, engines)
            cli = await asyncio.to_thread(usage_cli, admin, "--json")
            table = await asyncio.to_thread(usage_cli, admin)
    assert body["shared"] is True and set(body["tenants"]) == {"acme", ODD, "anonymous"}
    for tenant, (requests, prompt, completion) in expected.items():
        sums = body["tenants"][tenant]
        assert requests == 2 * PER_TENANT
        assert (sums["requests"], sums["errors"]) == (requests, 0), tenant
        assert (sums["prompt_tokens"], sums["completion_tokens"]) == (prompt, completion), tenant
        assert sums["models"][MODEL]["requests"] == requests
    total = body["total"]
    print(
        f"usage records: {total}; engines: prompt {engines_prompt}, completion {engines_completion}"
    )
    assert (total["prompt_tokens"], total["completion_tokens"]) == (
        engines_prompt, engines_completion
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    printed = json.loads(cli.stdout)
    assert printed["tenants"] == body["tenants"] and printed["total"] == total
    assert table.returncode == 0, table.stderr
    assert "acme" in table.stdout and f"{total['prompt_tokens']:,}" in table.stdout


def post_json(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


@pytest.mark.parametrize("shared", [False, True], ids=["own-records", "redis"])
def test_the_parent_of_workers_answers_for_all_of_them(tmp_path, request, shared) -> None:
    """Without Redis each worker keeps its own record: the one admin listener asks each
    and answers their sum. With Redis every worker flushes, and one reads the record all
    of them wrote."""
    requests = 20
    extra = {"redis": shared_redis(request.getfixturevalue("redis").url)} if shared else {}
    with fake_engines(("L4", 0.02)) as (engine,):
        port, admin_port = free_port(), free_port()
        config = router_toml(
            [(engine.url, "L4")], port=port, admin_listen=f"port = {admin_port}", **extra
        )
        path = tmp_path / "router.toml"
        path.write_text(config.replace(ROUTER_ON_LOOPBACK, ""))
        with (tmp_path / "router.log").open("wb") as log:
            router = subprocess.Popen(
                gpuroute_cmd("router", "--config", str(path), "--workers", "2"),
                stdout=subprocess.DEVNULL, stderr=log,
            )  # fmt: skip
        try:
            admin = f"http://127.0.0.1:{admin_port}"
            wait_for(lambda: http_ok(admin + "/readyz"), 60, "both workers ready")
            prompt = completion = 0
            for _ in range(requests):  # a connection each: the kernel spreads them
                answer = post_json(f"http://127.0.0.1:{port}/v1/chat/completions", chat_body())
                prompt += answer["usage"]["prompt_tokens"]
                completion += answer["usage"]["completion_tokens"]
            body = get_json(admin + "/admin/usage?since=1h")
            with urllib.request.urlopen(admin + "/metrics", timeout=5) as r:
                metrics = r.read().decode()
        finally:
            assert stopped(router, tmp_path / "router.log") == 0
    served = {
        s.labels["worker"]
        for family in text_string_to_metric_families(metrics)
        for s in family.samples
        if s.name == "gpuroute_tokens_total" and s.value > 0
    }
    assert served == {"0", "1"}  # both workers' records in the sum
    assert body["shared"] is shared
    assert body["tenants"]["anonymous"]["models"][MODEL] == {
        "requests": requests, "errors": 0, "prompt_tokens": prompt, "completion_tokens": completion
    }  # fmt: skip
