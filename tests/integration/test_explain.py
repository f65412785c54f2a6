"""An operator asks a live router why (issue 31): each answer names its request
(`x-request-id`), and `gpuroute explain ID` (the admin listener's `/admin/explain/{id}`)
answers from one request's decision log entries, with sampling off:
- a retry: which backend failed and how, and that the next attempt excluded it;
- the choice of an L4: the H100 was tried and failed, so it was no candidate;
- a 429 `slo_unattainable`: no backend was predicted to meet the class (each one's predicted
  TTFT against its bound), and its TTFT budget ran out;
- a 503: every backend serving the model, and the state that keeps it from routing;
- a residency refusal: why the decision was refused."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time

import aiohttp
from aiohttp import web
from support.live import MODEL, chat_body, gpuroute_cmd, router_server, scripted_backend

from gpuroute.auth import key_digest
from gpuroute.residency_decision import HEADER, sign

STANDARD_KEY, TIGHT_KEY = "sk-standard", "sk-tight"


async def failing(_request: web.Request) -> web.Response:
    return web.json_response({"error": "engine failure"}, status=500)


async def answering(_request: web.Request) -> web.Response:
    return web.json_response({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}})


def config(h100: str, l4: str, dead: str) -> str:
    keys = "".join(
        f'[[auth.keys]]\nsha256 = "{key_digest(key)}"\ntenant = "{tenant}"\n' + extra
        for key, tenant, extra in (
            (STANDARD_KEY, "a", ""),
            (TIGHT_KEY, "b", 'slo_class = "impossible"\n'),
        )
    )
    return (
        "tick_s = 0.05\n[listen]\nport = 0\n[admin_listen]\nport = 0\n"
        '[slo]\n[[slo.classes]]\nname = "standard"\nttft_s = 2.0\ntpot_s = 0.2\n'
        '[[slo.classes]]\nname = "impossible"\nttft_s = 0.0001\ntpot_s = 0.0001\n'
        f"[auth]\n{keys}"
        f'[[backends]]\nurl = "{h100}"\ngpu = "H100"\nmodels = ["{MODEL}"]\n'
        f'[[backends]]\nurl = "{l4}"\ngpu = "L4"\nmodels = ["{MODEL}"]\n'
        f'[[backends]]\nurl = "{dead}"\ngpu = "L4"\nmodels = ["other-model"]\n'
    )


async def ask(session: aiohttp.ClientSession, base: str, key: str, model: str = MODEL):
    body = chat_body("why") | {"model": model}
    headers = {"Authorization": f"Bearer {key}"}
    async with session.post(f"{base}/v1/chat/completions", json=body, headers=headers) as answer:
        payload = await answer.json()
        return answer.status, answer.headers["x-request-id"], payload


async def explained(session: aiohttp.ClientSession, admin: str, request_id: str) -> list[dict]:
    async with session.get(f"{admin}/admin/explain/{request_id}") as answer:
        assert answer.status == 200, await answer.text()
        return (await answer.json())["events"]


def test_the_decision_log_answers_five_questions(tmp_path) -> None:
    async def scenario() -> None:
        async with (
            scripted_backend(failing) as h100,
            scripted_backend(answering) as l4,
            aiohttp.ClientSession() as session,
        ):
            dead = "http://127.0.0.1:9"  # discard port: nothing listens
            async with router_server(config(h100, l4, dead), tmp_path) as server:
                base = f"http://127.0.0.1:{server.port}"
                admin = f"http://127.0.0.1:{server.admin_port}"
                await retried_onto_the_l4(session, base, admin)
                await refused_as_unattainable(session, base, admin)
                await no_backend(session, base, admin)
                await explained_by_the_cli(session, base, admin)

    asyncio.run(asyncio.wait_for(scenario(), 60))


async def retried_onto_the_l4(session, base: str, admin: str) -> None:
    status, request_id, _ = await ask(session, base, STANDARD_KEY)
    assert status == 200
    first, failed, second = await explained(session, admin, request_id)
    h100 = first["chosen"]
    assert (first["event"], first["chosen_gpu"], first["attempt"]) == ("decision", "H100", 0)
    assert first["fits_slo"] is True and first["reason"] == "policy"
    assert {row["gpu"] for row in first["candidates"]} == {"H100", "L4"}
    assert (failed["event"], failed["backend"], failed["kind"]) == ("attempt_failed", h100, "5xx")
    assert (second["chosen_gpu"], second["attempt"]) == ("L4", 1)
    assert second["excluded"] == {h100: "tried by an earlier attempt"}
    assert [row["gpu"] for row in second["candidates"]] == ["L4"]
    assert second["candidates"][0]["filter"] == "fits" and "score" in second["candidates"][0]


async def refused_as_unattainable(session, base: str, admin: str) -> None:
    status, request_id, payload = await ask(session, base, TIGHT_KEY)
    assert (status, payload["error"]["code"]) == (429, "slo_unattainable")
    # its 0.1 ms TTFT budget is spent before it could wait: the hold queue refuses it at
    # once, so it is never logged as held
    decision, refused = await explained(session, admin, request_id)
    assert decision["event"] == "decision" and decision["fits_slo"] is False
    assert decision["booked"] is False and decision["slo_class"] == "impossible"
    assert all(
        row["filter"].startswith("dropped: predicted TTFT") for row in decision["candidates"]
    )
    assert (refused["status"], refused["code"]) == (429, "slo_unattainable")
    assert "'impossible'" in refused["why"] and "deadline" in refused["why"]


async def no_backend(session, base: str, admin: str) -> None:
    """The only backend of `other-model` refuses connections: the first request trips its
    breaker (502 after its one attempt), the next is refused with 503 and the reason."""
    status, request_id, _ = await ask(session, base, STANDARD_KEY, "other-model")
    assert status == 502
    decision, failed, none_left, refused = await explained(session, admin, request_id)
    dead = decision["chosen"]
    assert (failed["backend"], failed["kind"]) == (dead, "refused")
    assert none_left["event"] == "no_candidate"
    assert none_left["excluded"] == {dead: "tried by an earlier attempt"}
    assert (refused["status"], refused["code"]) == (502, "upstream_error")
    assert "cannot connect" in refused["why"]
    status, request_id, payload = await ask(session, base, STANDARD_KEY, "other-model")
    assert (status, payload["error"]["code"]) == (503, "no_backend")
    (refused,) = await explained(session, admin, request_id)
    assert refused["status"] == 503 and refused["model"] == "other-model"
    assert refused["why"].startswith("no backend is routable: ") and "ejected" in refused["why"]


async def explained_by_the_cli(session, base: str, admin: str) -> None:
    """`gpuroute explain` as an operator runs it, and its answer for an unknown id."""
    _, request_id, _ = await ask(session, base, STANDARD_KEY)
    command = gpuroute_cmd("explain", request_id, "--admin-url", admin)
    shown = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    assert f"decision (request {request_id}, tenant " in shown.stdout
    assert f", model {MODEL}, " in shown.stdout
    assert "chose " in shown.stdout and "not a candidate: " in shown.stdout
    as_json = await asyncio.to_thread(
        subprocess.run, [*command, "--json"], capture_output=True, text=True
    )
    assert json.loads(as_json.stdout) == await explained(session, admin, request_id)
    unknown = await asyncio.to_thread(
        subprocess.run,
        gpuroute_cmd("explain", "0123456789abcdef", "--admin-url", admin),
        capture_output=True,
        text=True,
    )
    assert unknown.returncode == 1
    assert "404: request '0123456789abcdef' is not among the recent ones" in unknown.stderr


def test_a_residency_refusal_is_explained(tmp_path) -> None:
    """A decision the global tier made for the US reaches a router in the EU: 403, and the
    log says which places the decision allowed and where this router is."""
    secret = b"decision-key-for-explain"

    async def scenario() -> None:
        async with scripted_backend(answering) as engine, aiohttp.ClientSession() as session:
            text = (
                "tick_s = 0.05\n[listen]\nport = 0\n[admin_listen]\nport = 0\n"
                '[region]\nname = "eu-west"\njurisdiction = "eu"\n'
                f'decision_key = "{secret.decode()}"\nrequire_global_decision = true\n'
                f'[auth]\n[[auth.keys]]\nsha256 = "{key_digest(STANDARD_KEY)}"\ntenant = "a"\n'
                f'[[backends]]\nurl = "{engine}"\ngpu = "H100"\nmodels = ["{MODEL}"]\n'
            )
            async with router_server(text, tmp_path) as server:
                decision = sign(frozenset({"us"}), secret, time.time(), api_key=STANDARD_KEY)
                headers = {"Authorization": f"Bearer {STANDARD_KEY}", HEADER: decision}
                url = f"http://127.0.0.1:{server.port}/v1/chat/completions"
                async with session.post(url, json=chat_body(), headers=headers) as answer:
                    assert answer.status == 403
                    request_id = answer.headers["x-request-id"]
                admin = f"http://127.0.0.1:{server.admin_port}"
                (refused,) = await explained(session, admin, request_id)
                assert (refused["status"], refused["code"]) == (403, "residency_violation")
                assert refused["why"] == "residency allows us; this router is in eu, eu-west"

    asyncio.run(asyncio.wait_for(scenario(), 30))
