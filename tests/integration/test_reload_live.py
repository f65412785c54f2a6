"""Hot reload and the admin API through a live router in front of fake engines: a reload
under 200 concurrent streams fails none of them and puts the new policy, key and backend
in force for the requests after it (the removed backend drains its streams, then goes);
a bad file, or one that changes what needs a restart, is refused and the old config runs
on; static backends added, drained and removed through the API."""

from __future__ import annotations

import asyncio
import hashlib

import aiohttp
import pytest
from support.live import chat_body, counter, fake_engines, router_server, router_toml

pytestmark = pytest.mark.asyncio
STREAMS = 200
JSON = {"Content-Type": "application/json"}  # every admin write is JSON (admin_guard.py)
KEY1, KEY2 = "sk-one", "sk-two"


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def config(engines: list[str], *, policy: str, keys: list[str], extra: str = "") -> str:
    text = router_toml([(url, "L4") for url in engines], policy=policy)
    text = extra + text
    for key in keys:
        text += f'[[auth.keys]]\nsha256 = "{digest(key)}"\ntenant = "{key}"\n'
    return text


async def stream(session: aiohttp.ClientSession, url: str, key: str) -> bytes:
    headers = {"Authorization": f"Bearer {key}"}
    body = chat_body(stream=True, max_tokens=48)
    async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
        assert r.status == 200, await r.text()
        return await r.read()


async def served_by(session: aiohttp.ClientSession, url: str, key: str) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {key}"}
    body = chat_body(max_tokens=2)
    async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
        await r.read()
        return r.status, r.headers.get("x-gpuroute-backend", "")


async def test_reload_under_200_streams_fails_none_and_applies_the_new_config(tmp_path) -> None:
    with fake_engines(("L4", 4.0), ("L4", 1.0)) as (old_engine, new_engine):
        first = config([old_engine.url], policy="round_robin", keys=[KEY1])
        async with router_server(first, tmp_path) as server:
            app, url = server.servable, f"http://127.0.0.1:{server.port}"
            app.operator.reloader.path = tmp_path / "router.toml"
            old_id = next(iter(app.operator.reloader.static))
            conn = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=conn) as s:
                assert (await served_by(s, url, KEY2))[0] == 401
                streams = [asyncio.create_task(stream(s, url, KEY1)) for _ in range(STREAMS)]
                for _ in range(400):  # every stream admitted and under way
                    if app.active >= STREAMS:
                        break
                    await asyncio.sleep(0.025)
                assert app.active >= STREAMS
                second = config(
                    [new_engine.url], policy="least_outstanding_work", keys=[KEY1, KEY2]
                )
                (tmp_path / "router.toml").write_text(second)
                async with s.post(url + "/admin/reload", headers=JSON) as r:
                    assert r.status == 200, await r.text()
                assert app.active >= STREAMS // 2  # the reload came while they streamed
                assert app.scheduler.policy.name == "least_outstanding_work"
                status, backend = await served_by(s, url, KEY2)  # the new key, the new backend
                assert status == 200 and backend != old_id
                bodies = await asyncio.gather(*streams)
                failed = [b for b in bodies if not b.endswith(b"data: [DONE]\n\n") or b"error" in b]
                assert failed == []
                for _ in range(100):  # drained, then dropped
                    if old_id not in app.scheduler.backends:
                        break
                    await asyncio.sleep(0.05)
                assert old_id not in app.scheduler.backends


async def test_a_bad_file_or_a_restart_key_is_refused_and_the_old_config_runs_on(
    tmp_path, caplog
) -> None:
    with fake_engines(("L4", 1.0)) as (engine,):
        first = config([engine.url], policy="round_robin", keys=[KEY1])
        async with router_server(first, tmp_path) as server:
            app, url = server.servable, f"http://127.0.0.1:{server.port}"
            path = tmp_path / "router.toml"
            app.operator.reloader.path = path
            bad = {
                "policy": first.replace('policy = "round_robin"', 'policy = "no_such_policy"'),
                "toml": first + "[[[ broken\n",
                "listen": first.replace("port = 0", "port = 1"),
                "models": first + '[[models]]\nname = "a"\naliases = ["a"]\n',
            }
            async with aiohttp.ClientSession() as s:
                for what, text in bad.items():
                    path.write_text(text.replace(digest(KEY1), digest(KEY2)))
                    async with s.post(url + "/admin/reload", headers=JSON) as r:
                        answer = await r.json()
                        assert r.status == 400, (what, answer)
                    assert answer["error"]["code"] == "reload_refused"
                    assert str(path) in answer["error"]["message"], answer
                    if what == "listen":
                        assert "listen: changes need a restart" in answer["error"]["message"]
                    assert app.scheduler.policy.name == "round_robin"
                    assert (await served_by(s, url, KEY1))[0] == 200  # the old keys
                    assert (await served_by(s, url, KEY2))[0] == 401
            # each refusal logged (who asked, why) and counted
            refused = [r for r in caplog.records if "reload refused" in r.getMessage()]
            assert len(refused) == len(bad)
            assert all(r.getMessage().startswith("POST /admin/reload from 127.0.0.1: ")
                       for r in refused)  # fmt: skip
            assert counter(app, "gpuroute_config_reloads", outcome="refused", via="http") == len(
                bad
            )
            assert counter(app, "gpuroute_config_reloads", outcome="applied", via="http") == 0


async def test_static_backends_are_added_drained_and_removed_through_the_api(tmp_path) -> None:
    with fake_engines(("L4", 1.0), ("L4", 1.0)) as (a, b):
        async with router_server(config([a.url], policy="round_robin", keys=[]), tmp_path) as srv:
            url = f"http://127.0.0.1:{srv.port}"
            backends = srv.servable.scheduler.backends
            async with aiohttp.ClientSession() as s:
                new = {"url": b.url, "gpu": "L4", "models": ["llama-3.1-8b"], "id": "b"}
                async with s.post(url + "/admin/backends", json=new) as r:
                    assert r.status == 201, await r.text()
                async with s.post(url + "/admin/backends", json=new) as r:
                    assert r.status == 400  # the id is taken
                a_id = next(x.backend_id for x in backends if x.backend_id != "b")
                async with s.post(url + f"/admin/backends/{a_id}/drain", headers=JSON) as r:
                    assert r.status == 200
                assert {(await served_by(s, url, "x"))[1] for _ in range(6)} == {"b"}
                async with s.delete(url + f"/admin/backends/{a_id}", headers=JSON) as r:
                    assert r.status == 200
                async with s.delete(url + "/admin/backends/nope", headers=JSON) as r:
                    assert r.status == 404
                for _ in range(100):
                    if a_id not in backends:
                        break
                    await asyncio.sleep(0.05)
                assert [x.backend_id for x in backends] == ["b"]
