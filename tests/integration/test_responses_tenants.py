"""Tenant isolation of stored responses, as an attacker would try it: tenant B reading,
continuing, cancelling or deleting tenant A's response id gets the 404 an unknown id gets;
keys are required where they are; the same across two router replicas sharing Redis (where
A's responses are read on either replica)."""

from __future__ import annotations

import aiohttp
import pytest
from support.live import MODEL, fake_engines, router_toml, running_router

from gpuroute.auth import key_digest

pytestmark = pytest.mark.asyncio
KEY_A, KEY_B = "sk-tenant-a-1", "sk-tenant-b-1"
A, B = ({"Authorization": f"Bearer {k}"} for k in (KEY_A, KEY_B))
AUTH = "".join(
    f'[[auth.keys]]\nsha256 = "{key_digest(k)}"\ntenant = "{t}"\n'
    for k, t in ((KEY_A, "acme"), (KEY_B, "globex"))
)


def config(urls: list[str], **sections: str) -> str:
    return router_toml([(u, "H100") for u in urls], auth="required = true\n" + AUTH, **sections)


async def create(s: aiohttp.ClientSession, url: str, headers: dict, **extra) -> dict:
    body = {"model": MODEL, "input": "acme's secret plan", "max_output_tokens": 3} | extra
    async with s.post(url + "/v1/responses", json=body, headers=headers) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def refused_as_unknown(s: aiohttp.ClientSession, url: str, rid: str) -> list[tuple]:
    """What tenant B gets for `rid` on every route that takes an id."""
    by_id = f"{url}/v1/responses/{rid}"
    follow = {"model": MODEL, "input": "x", "previous_response_id": rid}
    answers = []
    for method, path, body in (
        ("GET", by_id, None),
        ("DELETE", by_id, None),
        ("POST", by_id + "/cancel", None),
        ("POST", url + "/v1/responses", follow),
    ):
        async with s.request(method, path, json=body, headers=B) as r:
            error = (await r.json())["error"]
            answers.append((r.status, error["code"], error["message"].replace(rid, "ID")))
    return answers


async def test_a_tenant_cannot_see_continue_or_delete_another_tenants_response(tmp_path) -> None:
    with fake_engines(("H100", 1.0)) as [engine]:
        async with running_router(config([engine.url]), tmp_path) as (url, _):
            async with aiohttp.ClientSession() as s:
                mine = await create(s, url, A)
                theirs = await refused_as_unknown(s, url, mine["id"])
                unknown = await refused_as_unknown(s, url, "resp_" + "0" * 32)
                assert theirs == unknown  # nothing tells B the id exists
                assert {a[:2] for a in theirs} == {(404, "response_not_found")}
                async with s.get(f"{url}/v1/responses/{mine['id']}", headers=A) as r:
                    assert r.status == 200  # B's DELETE removed nothing
                for headers in ({}, {"Authorization": "Bearer sk-nope"}):
                    async with s.get(f"{url}/v1/responses/{mine['id']}", headers=headers) as r:
                        assert r.status == 401
                        assert (await r.json())["error"]["code"] == "invalid_api_key"
                async with s.post(
                    url + "/v1/responses",
                    json={"model": MODEL, "input": "x", "conversation": "conv_1"},
                    headers=A,
                ) as r:
                    assert r.status == 400
                    assert (await r.json())["error"]["param"] == "conversation"


async def test_two_replicas_sharing_redis_share_responses_but_not_across_tenants(
    redis, tmp_path
) -> None:
    with fake_engines(("H100", 1.0), ("H100", 1.0)) as engines:
        text = config([e.url for e in engines], redis=f'url = "{redis.url}"\ntimeout_s = 1.0')
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        async with running_router(text, tmp_path / "a", seed=1) as (one, _):
            async with running_router(text, tmp_path / "b", seed=2) as (two, _):
                async with aiohttp.ClientSession() as s:
                    first = await create(s, one, A)
                    async with s.get(f"{two}/v1/responses/{first['id']}", headers=A) as r:
                        assert r.status == 200 and (await r.json())["id"] == first["id"]
                    second = await create(s, two, A, previous_response_id=first["id"])
                    assert second["usage"]["input_tokens"] > first["usage"]["input_tokens"]
                    theirs = await refused_as_unknown(s, two, first["id"])
                    assert {a[:2] for a in theirs} == {(404, "response_not_found")}
                    async with s.delete(f"{two}/v1/responses/{first['id']}", headers=A) as r:
                        assert r.status == 200 and (await r.json())["deleted"] is True
                    async with s.get(f"{one}/v1/responses/{first['id']}", headers=A) as r:
                        assert r.status == 404  # deleted on one replica: gone on both
