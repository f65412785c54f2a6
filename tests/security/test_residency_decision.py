"""Residency the global tier decided, enforced where the request lands (issue 16 item 4),
and bound to the request it was made for (issue 30 item 3): a decision captured on the
global tier → router hop was a bearer token for 60 s, replayed with another tenant's key."""

from __future__ import annotations

import time

import aiohttp
import pytest
from support import components
from support.global_tier import global_tier
from support.live import router_replicas, router_server, scripted_backend, shared_redis
from support.redis_server import RedisServer
from support_security import RecordingEngine, chat, secure_toml, send_raw
from support_tiers import EU_KEY, KEY, two_regions

from gpuroute.auth import key_digest
from gpuroute.residency_decision import HEADER

SECRET = b"shared-between-the-tiers"
EU = frozenset({"eu"})
JSON = {"Content-Type": "application/json"}
OTHER_KEY = "sk-someone-else"


def test_a_decision_verifies_only_unaltered_unexpired_and_under_the_key() -> None:
    from gpuroute.residency_decision import DEFAULT_TTL_S, DecisionError, key_binding, sign, verify

    signed = sign(EU, SECRET, now=1000.0, api_key=KEY)
    decision = verify(signed, SECRET, now=1000.0 + DEFAULT_TTL_S)
    assert decision.jurisdictions == EU and decision.key == key_binding(KEY)
    anywhere = verify(sign(None, SECRET, now=1000.0, api_key=None), SECRET, now=1000.0)
    assert anywhere.jurisdictions is None and anywhere.key == "-"
    tampered = signed.replace(";eu;", ";eu,us;")
    rebound = signed.replace(key_binding(KEY), key_binding(OTHER_KEY))
    for bad, now in (
        (tampered, 1000.0),
        (rebound, 1000.0),
        (signed, 1001.0 + DEFAULT_TTL_S),
        ("v2;eu;9;-;n", 1000.0),
        ("v1;eu;9999;" + signed.rpartition(";")[2], 1000.0),  # the old unbound format
    ):
        with pytest.raises(DecisionError):
            verify(bad, SECRET, now)
    with pytest.raises(DecisionError):
        verify(signed, b"another key", 1000.0)
    nonces = {
        verify(sign(EU, SECRET, 1000.0, api_key=KEY), SECRET, 1000.0).nonce for _ in range(50)
    }
    assert len(nonces) == 50  # fresh for every request


def router_with_decisions(url: str, redis_url: str | None = None) -> str:
    region = (
        'name = "eu-west"\njurisdiction = "eu"\ndecision_key = "shared-between-the-tiers"\n'
        "require_global_decision = true"
    )
    keys = "".join(
        f'[[auth.keys]]\nsha256 = "{key_digest(k)}"\ntenant = "{k}"\n' for k in (KEY, OTHER_KEY)
    )
    extra = {"redis": shared_redis(redis_url, "share_load = false")} if redis_url else {}
    return secure_toml(url, top=f"[region]\n{region}\n{keys}", **extra)


def auth(key: str | None, decision: str | None) -> dict[str, str]:
    headers = dict(JSON)
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    if decision is not None:
        headers[HEADER] = decision
    return headers


@pytest.mark.asyncio
async def test_a_router_serves_only_what_the_global_tier_let_through(tmp_path) -> None:
    from gpuroute.residency_decision import sign

    engine = RecordingEngine()
    async with scripted_backend(engine) as url:
        async with router_server(router_with_decisions(url), tmp_path) as server:
            base = f"http://127.0.0.1:{server.port}/v1/chat/completions"
            now = time.time()
            cases = [
                (auth(KEY, None), 403, "global_decision_required"),  # straight to the router
                (auth(KEY, sign(frozenset({"us"}), SECRET, now, api_key=KEY)), 403,
                 "residency_violation"),
                (auth(KEY, sign(EU, b"guessed", now, api_key=KEY)), 403,
                 "invalid_residency_decision"),
                (auth(KEY, sign(EU, SECRET, now - 11, api_key=KEY)), 403,
                 "invalid_residency_decision"),  # expired: 10 s by default
                (auth(KEY, sign(EU, SECRET, now, api_key=KEY)), 200, None),
                (auth(KEY, sign(None, SECRET, now, api_key=KEY)), 200, None),
                ({**JSON, "Authorization": "Basic x", HEADER: sign(EU, SECRET, now, api_key=KEY)},
                 401, "invalid_api_key"),  # no key at all: the key's error, not "another key"
            ]  # fmt: skip
            async with aiohttp.ClientSession() as s:
                for headers, status, code in cases:
                    async with s.post(base, data=chat(), headers=headers) as r:
                        assert r.status == status, (headers, await r.text())
                        if code:
                            assert (await r.json())["error"]["code"] == code
    assert len(engine.seen) == 2
    assert all(HEADER not in {k.lower() for k in h} for _, h, _ in engine.seen)


async def capture_a_decision(tmp_path, key: str) -> str:
    """What an eavesdropper on the global tier -> router hop sees of a request with `key`."""
    wire = RecordingEngine()
    async with scripted_backend(wire) as region:
        extra = f'[residency]\ndecision_key = "{SECRET.decode()}"\n'
        async with global_tier(tmp_path, region, extra) as (url, _app):
            answer = await send_raw(
                url, [*JSON.items(), ("Authorization", f"Bearer {key}")], chat()
            )
            assert answer.status == 200
    [(_, headers, _)] = wire.seen
    return next(v for k, v in headers.items() if k.lower() == HEADER)


@pytest.mark.asyncio
async def test_a_captured_decision_is_no_bearer_token(tmp_path) -> None:
    """The attack: a decision captured on the plaintext hop, replayed with another tenant's
    key (and without a key, and then with its own key). Each replay is refused; the
    request it was made for is served once."""
    captured = await capture_a_decision(tmp_path, KEY)
    engine = RecordingEngine()
    async with scripted_backend(engine) as url:
        (tmp_path / "router").mkdir()
        async with router_server(router_with_decisions(url), tmp_path / "router") as server:
            base = f"http://127.0.0.1:{server.port}/v1/chat/completions"
            async with aiohttp.ClientSession() as s:
                statuses = []
                for key in (OTHER_KEY, OTHER_KEY, None, KEY, KEY, KEY):
                    async with s.post(base, data=chat(), headers=auth(key, captured)) as r:
                        statuses.append(r.status)
                        message = (await r.json()).get("error", {}).get("message", "")
                        if key != KEY:
                            assert "another API key" in message
    assert statuses == [403, 403, 403, 200, 403, 403]
    assert len(engine.seen) == 1


@pytest.mark.asyncio
async def test_router_replicas_share_which_decisions_were_used(tmp_path) -> None:
    """Two replicas of one region's router behind Redis: a decision used at one is refused
    at the other."""
    components.redis()
    redis = RedisServer(tmp_path)
    redis.start()
    engine = RecordingEngine()
    try:
        decision = await capture_a_decision(tmp_path, KEY)
        async with scripted_backend(engine) as url:
            text = router_with_decisions(url, redis.url)
            async with router_replicas(text, tmp_path) as (one, two), aiohttp.ClientSession() as s:
                statuses = []
                for server in (one, two, one):
                    base = f"http://127.0.0.1:{server.port}/v1/chat/completions"
                    async with s.post(base, data=chat(), headers=auth(KEY, decision)) as r:
                        statuses.append(r.status)
        assert statuses == [200, 403, 403] and len(engine.seen) == 1
    finally:
        redis.stop()


@pytest.mark.asyncio
async def test_the_global_tier_never_passes_on_a_client_decision(tmp_path) -> None:
    """A live global tier: a client's decision header (a forged one, or a real one signed
    for anywhere that it captured) never reaches the router; the tier's own does, bound to
    the client's key, fresh on every request."""
    from gpuroute.residency_decision import key_binding, sign, verify

    router = RecordingEngine()  # records what the global tier sends the region's router
    async with scripted_backend(router) as region:
        extra = f'[residency]\ndecision_key = "{SECRET.decode()}"\n'
        async with global_tier(tmp_path, region, extra) as (url, _app):
            for sent in (
                "v2;*;9999999999;-;n;forged",
                sign(None, SECRET, time.time(), api_key=None),
            ):
                headers = [*JSON.items(), ("Authorization", f"Bearer {EU_KEY}"), (HEADER, sent)]
                answer = await send_raw(url, headers, chat())
                assert answer.status == 200, answer.body
    decisions = []
    for _, headers, _ in router.seen:
        [value] = [v for k, v in headers.items() if k.lower() == HEADER]
        decisions.append(value)
        decision = verify(value, SECRET, time.time())
        assert decision.key == key_binding(EU_KEY)
    assert len(set(decisions)) == 2  # neither is the client's; each request its own nonce


@pytest.mark.asyncio
async def test_a_failover_attempt_carries_a_fresh_decision(tmp_path) -> None:
    """Every attempt gets its own nonce: a region that fails before answering does not
    spend the decision the next region needs (here both regions' routers share one Redis,
    so a reused nonce would be refused)."""
    components.redis()
    redis = RedisServer(tmp_path)
    redis.start()
    try:
        shared = "[redis]\n" + shared_redis(redis.url, "share_load = false")
        async with two_regions(tmp_path, router_top=shared) as tiers:
            tiers.engines["us-east"].fail_when = lambda body: True  # us-east answers 500
            headers = [*JSON.items(), ("Authorization", f"Bearer {KEY}")]
            answer = await send_raw(tiers.url, [*headers, ("x-gpuroute-region", "us-east")], chat())
        assert answer.status == 200, answer.body
        assert answer.headers["x-gpuroute-region"] == "eu-west"
        assert tiers.served_in() == {"us-east": 1, "eu-west": 1}
    finally:
        redis.stop()


def test_a_router_checking_decisions_must_know_its_jurisdiction() -> None:
    """The global tier's decisions name jurisdictions (eu, us), never regions: a router
    without one would refuse every EU-bound request it is meant to serve."""
    from gpuroute.router.config.router import RegionConfig

    with pytest.raises(ValueError, match=r"set region\.jurisdiction too"):
        RegionConfig(name="eu-west", decision_key="k")
    with pytest.raises(ValueError, match=r"set region\.decision_key too"):
        RegionConfig(name="eu-west", jurisdiction="eu", require_global_decision=True)
