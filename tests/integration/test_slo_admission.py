"""SLO classes through a live router: chosen by key, header and default; a request no
backend can serve within its class is refused early with 429 naming the class."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web
from support.live import MODEL, chat_body, router_toml, running_router, scripted_backend

from gpuroute.auth import key_digest

pytestmark = pytest.mark.asyncio
KEY = "sk-slo-test"
SLO = """default_class = "standard"
[[slo.classes]]
name = "instant"
ttft_s = 0.0005
tpot_s = 0.05
[[slo.classes]]
name = "standard"
ttft_s = 5.0
tpot_s = 0.5
"""


class Engine:
    """Answers every request and counts them (a refused request must never reach it)."""

    def __init__(self) -> None:
        self.requests = 0

    async def __call__(self, request: web.Request) -> web.Response:
        self.requests += 1
        usage = {"completion_tokens": 2}
        return web.json_response({"id": "x", "object": "chat.completion", "usage": usage})


async def test_classes_by_key_and_header_and_early_refusal_naming_the_class(tmp_path) -> None:
    auth = (
        f'allow_anonymous = true\n[[auth.keys]]\nsha256 = "{key_digest(KEY)}"\n'
        'tenant = "fast"\nslo_class = "instant"'
    )
    engine = Engine()
    async with scripted_backend(engine) as url:
        text = router_toml([(url, "L4")], slo=SLO, auth=auth)
        async with running_router(text, tmp_path) as (router_url, router):
            post = router_url + "/v1/chat/completions"
            long_prompt = chat_body("word " * 4000)
            async with aiohttp.ClientSession() as s:
                # keyless: the default class, served
                async with s.post(post, json=long_prompt) as r:
                    assert r.status == 200
                # asking for a more demanding class than the default is not granted
                instant = {"x-gpuroute-slo": "instant"}
                async with s.post(post, json=long_prompt, headers=instant) as r:
                    assert r.status == 200
                # the key's class cannot be met by any backend: refused, class named
                served = engine.requests
                auth_header = {"Authorization": f"Bearer {KEY}"}
                async with s.post(post, json=long_prompt, headers=auth_header) as r:
                    body = await r.json()
                    assert r.status == 429 and body["error"]["code"] == "slo_unattainable"
                    assert "'instant'" in body["error"]["message"]
                    assert int(r.headers["Retry-After"]) >= 1
                assert engine.requests == served  # refused before any engine saw it
                # the key may ask for a less demanding class
                headers = auth_header | {"x-gpuroute-slo": "standard"}
                async with s.post(post, json=long_prompt, headers=headers) as r:
                    assert r.status == 200
                async with s.post(post, json=chat_body(), headers={"x-gpuroute-slo": "gold"}) as r:
                    body = await r.json()
                    assert r.status == 400 and body["error"]["code"] == "invalid_slo_class"
            sample = router.metrics.registry.get_sample_value
            refused = {"slo_class": "instant", "model": MODEL, "outcome": "refused"}
            assert sample("gpuroute_slo_requests_total", refused) == 1
            assert len(router.scheduler.ledger) == 0  # nothing booked for the refused one
            met = {"slo_class": "standard", "model": MODEL, "outcome": "met"}
            assert sample("gpuroute_slo_requests_total", met) >= 3


async def test_a_reload_to_a_predicting_policy_holds_what_it_predicts_will_miss(tmp_path) -> None:
    """Under round robin (no prediction) an unmeetable class is sent; reloaded to the default
    policy, the same request is refused before any engine sees it: holding follows the
    policy in force, not the one the router started with."""
    auth = f'[[auth.keys]]\nsha256 = "{key_digest(KEY)}"\ntenant = "fast"\nslo_class = "instant"'
    engine = Engine()
    async with scripted_backend(engine) as url:
        text = router_toml([(url, "L4")], policy="round_robin", slo=SLO, auth=auth)
        path = tmp_path / "router.toml"
        async with running_router(text, tmp_path) as (router_url, router):
            router.operator.reloader.path = path
            post, headers = router_url + "/v1/chat/completions", {"Authorization": f"Bearer {KEY}"}
            long_prompt = chat_body("word " * 4000)
            async with aiohttp.ClientSession() as s:
                async with s.post(post, json=long_prompt, headers=headers) as r:
                    assert r.status == 200  # round robin predicts nothing: sent
                path.write_text(text.replace('policy = "round_robin"\n', ""))
                admin = router_url + "/admin/reload"
                async with s.post(admin, headers={"Content-Type": "application/json"}) as r:
                    assert r.status == 200, await r.text()
                served = engine.requests
                async with s.post(post, json=long_prompt, headers=headers) as r:
                    body = await r.json()
                    assert r.status == 429 and body["error"]["code"] == "slo_unattainable"
                assert engine.requests == served
