"""A canary through a live router (two workers, one admin listener) in front of two fake
engines serving `m@v1` and `m@v2` under `[[models]] name = "m"`: the split's share, every
session sticky (on either worker), aliases and unknown names, and a rollback under load
that fails no request and sends nothing to the canary once the PUT has returned.

Measured once over 10,000 requests (not part of the suite):
`PYTHONPATH=tests .venv/bin/python tests/integration/test_model_routing_live.py 10000 5`
(requests, the canary's percentage)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import openai
import pytest
from gpuroute.router.config.models import model_routes
from gpuroute.router.config.router import load_router_config
from gpuroute.router.front.parse import session_key
from gpuroute.testbed.loopback import TESTBED_ROUTER
from support.live import (
    FakeEngineProcess,
    async_wait_for,
    free_port,
    gpuroute_cmd,
    holds,
    http_ok,
    wait_for,
)

from gpuroute.headers import SERVED_MODEL_HEADER

pytestmark = pytest.mark.asyncio
V1, V2 = "m@v1", "m@v2"
CANARY = 10.0  # percent of sessions on m@v2 (90/10 keeps the suite's run short)


def canary_toml(engines: dict[str, str], port: int, admin_port: int, v2: float) -> str:
    backends = "".join(
        f'[[backends]]\nurl = "{url}"\ngpu = "H100"\nmodels = ["{name}"]\n'
        for name, url in engines.items()
    )
    # least work, not the default slo_aware: on a loaded CI machine the fake engines' learned
    # latency crossed the TTFT budget and SLO admission refused 46 of 2,000 requests (429),
    # which is admission working, not the split under test
    return (
        TESTBED_ROUTER + 'tick_s = 0.05\npolicy = "least_outstanding_work"\n'
        f"[listen]\nport = {port}\n[admin_listen]\nport = {admin_port}\n{backends}"
        f'[[models]]\nname = "m"\naliases = ["chat"]\n'
        f'split = {{"{V1}" = {100 - v2:g}, "{V2}" = {v2:g}}}\n'
    )


@dataclass
class Fleet:
    url: str
    admin: str
    path: Path  # the router's config: what the split is predicted from

    def __post_init__(self) -> None:
        self.routes = model_routes(load_router_config(self.path).models)

    def predicted(self, session: str) -> str:
        """The version the file's split gives `session` (as a third replica would)."""
        return self.routes.resolve("m", session_key(session)).model


@contextlib.contextmanager
def canary_fleet(tmp_path: Path, v2: float = CANARY, workers: int = 2):
    """Fake engines for m@v1 and m@v2, and `gpuroute router --workers N` in front."""
    engines: list[FakeEngineProcess] = []
    router: subprocess.Popen | None = None
    try:
        for name in (V1, V2):
            engines.append(FakeEngineProcess("H100", extra=("--served-name", name)))
        port, admin_port = free_port(), free_port()
        path = tmp_path / "router.toml"
        urls = {name: e.url for name, e in zip((V1, V2), engines, strict=True)}
        path.write_text(canary_toml(urls, port, admin_port, v2))
        with (tmp_path / "router.log").open("wb") as log:  # never a pipe nobody reads
            router = subprocess.Popen(
                gpuroute_cmd("router", "--config", str(path), "--workers", str(workers)),
                stdout=subprocess.DEVNULL, stderr=log,
            )  # fmt: skip
        admin = f"http://127.0.0.1:{admin_port}"
        wait_for(lambda: http_ok(admin + "/readyz"), 60, "the router's workers ready")
        yield Fleet(f"http://127.0.0.1:{port}", admin, path)
    finally:
        if router is not None and router.poll() is None:
            router.send_signal(signal.SIGTERM)
            try:
                router.wait(30)
            except subprocess.TimeoutExpired:
                router.kill()
                router.wait(10)
        for engine in engines:
            engine.stop()


@dataclass
class Result:
    session: str
    sent: float
    done: float
    status: int
    served: str | None  # the x-gpuroute-served-model header
    model: str | None  # the answer's `model` field (the first chunk's, when streamed)
    complete: bool  # a whole JSON answer, or a stream that ended with [DONE]


async def ask(
    s: aiohttp.ClientSession,
    url: str,
    session: str,
    *,
    model: str = "m",
    tokens: int | None = None,
    begun: asyncio.Event | None = None,
) -> Result:
    """One request in its own session: a one-token answer, or a stream of `tokens`
    (`begun` is set when its first bytes arrive)."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    body |= {"max_tokens": tokens or 1, "stream": tokens is not None}
    sent, chunks = time.monotonic(), []
    try:
        async with s.post(
            url + "/v1/chat/completions", json=body, headers={"x-session-id": session}
        ) as r:
            served, status = r.headers.get(SERVED_MODEL_HEADER), r.status
            async for chunk in r.content.iter_any():
                chunks.append(chunk)
                if begun is not None:
                    begun.set()
    except aiohttp.ClientError:
        served, status = None, 0
    result = Result(session, sent, time.monotonic(), status, served, None, False)
    raw = b"".join(chunks)
    if status != 200:
        return result
    if tokens is None:
        result.model, result.complete = json.loads(raw)["model"], True
        return result
    events = [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e]
    first = json.loads(events[0]) if events and events[0] != b"[DONE]" else {}
    result.model = first.get("model")
    result.complete = events[-1:] == [b"[DONE]"] and all(b'"error"' not in e for e in events)
    return result


async def load(
    url: str,
    sessions: list[str],
    concurrency: int = 16,
    *,
    tokens: int | None = None,
    stop: asyncio.Event | None = None,
    on_result: Callable[[Result], None] = lambda _r: None,
) -> list[Result]:
    """Each session asked once, `concurrency` at a time (bounded by the list; `stop` ends
    it early)."""
    results: list[Result] = []
    queue = iter(sessions)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as s:

        async def worker() -> None:
            for session in queue:
                if stop is not None and stop.is_set():
                    return
                result = await ask(s, url, session, tokens=tokens)
                results.append(result)
                on_result(result)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results


def split_report(
    fleet: Fleet, first: list[Result], again: list[Result], v2: float = CANARY
) -> dict:
    """Counts per version, the canary's share against its binomial σ, and stickiness."""
    counts = Counter(r.served for r in first)
    n, p = len(first), v2 / 100
    sigma = math.sqrt(n * p * (1 - p))
    version = {r.session: r.served for r in first}
    sticky = sum(version[r.session] == r.served for r in again)
    predicted = sum(fleet.predicted(r.session) == r.served for r in first)
    return {
        "n": n, "counts": dict(counts), "share_v2": counts[V2] / n,
        "z": (counts[V2] - n * p) / sigma, "sticky": sticky, "resent": len(again),
        "as_predicted": predicted,
    }  # fmt: skip


async def test_a_90_10_canary_splits_sessions_and_keeps_each_on_its_version(tmp_path) -> None:
    with canary_fleet(tmp_path) as fleet:
        sessions = [f"user-{i}" for i in range(2000)]
        first = await asyncio.wait_for(load(fleet.url, sessions), 240)
        assert [r for r in first if r.status != 200 or not r.complete] == []
        assert all(r.served == r.model for r in first)  # header and body agree
        # 400 sessions again, on new connections (either worker may take each)
        again = await asyncio.wait_for(load(fleet.url, sessions[::5]), 120)
        report = split_report(fleet, first, again)
    print(f"\ncanary split: {report}")
    assert set(report["counts"]) == {V1, V2}
    assert abs(report["z"]) <= 4.0, report  # within 4σ of 10 % (σ ≈ 13.4 requests)
    assert report["sticky"] == report["resent"] == 400  # 100 % sticky
    assert report["as_predicted"] == 2000  # each session's version is the file's hash's


async def test_aliases_unknown_models_and_the_model_list(tmp_path) -> None:
    with canary_fleet(tmp_path, workers=1) as fleet:
        client = openai.AsyncOpenAI(base_url=fleet.url + "/v1", api_key="unused", max_retries=0)
        try:
            listed = {m.id for m in (await client.models.list()).data}
            assert listed == {"m", "chat", V1, V2}
            for session in ("alice", "bob", "carol", "dave"):
                raw = await client.chat.completions.with_raw_response.create(
                    model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                    extra_headers={"x-session-id": session},
                )  # fmt: skip
                reply = raw.parse()
                assert raw.headers[SERVED_MODEL_HEADER] == reply.model == fleet.predicted(session)
                assert reply.choices[0].message.content == " tok" * 2
            with pytest.raises(openai.NotFoundError) as caught:
                await client.chat.completions.create(
                    model="nope", messages=[{"role": "user", "content": "x"}]
                )
            assert caught.value.body == {
                "message": "The model `nope` does not exist.", "type": "not_found_error",
                "param": "model", "code": "model_not_found",
            }  # fmt: skip
        finally:
            await client.close()


async def put_split(s: aiohttp.ClientSession, admin: str, split: dict[str, float]) -> dict:
    async with s.put(admin + "/admin/models/m/split", json={"split": split}) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def test_rollback_under_load_fails_nothing_and_ends_the_canary(tmp_path) -> None:
    with canary_fleet(tmp_path) as fleet:
        results: list[Result] = []
        stop = asyncio.Event()
        sessions = [f"load-{i}" for i in range(3000)]  # the loop's bound in count
        loading = asyncio.create_task(
            load(fleet.url, sessions, 8, tokens=4, stop=stop, on_result=results.append)
        )
        # long streams on the canary, under way when it is rolled back
        canaried = [x for x in (f"held-{i}" for i in range(300)) if fleet.predicted(x) == V2]
        try:
            async with asyncio.timeout(120), aiohttp.ClientSession() as s:  # and in time
                await async_wait_for(
                    holds(lambda: sum(r.served == V2 for r in results) >= 20), 60, "canary traffic"
                )
                begun = [asyncio.Event() for _ in range(3)]
                held = [
                    asyncio.create_task(ask(s, fleet.url, x, tokens=200, begun=b))
                    for x, b in zip(canaried, begun, strict=False)
                ]
                await asyncio.gather(*(b.wait() for b in begun))
                answer = await put_split(s, fleet.admin, {V1: 100, V2: 0})
                returned = time.monotonic()
                assert answer == {"model": "m", "split": {V1: 100.0, V2: 0.0}}
                await async_wait_for(
                    holds(lambda: sum(r.sent > returned for r in results) >= 300), 60, "more load"
                )
                stop.set()
                await loading
                held_results = await asyncio.gather(*held)
                moved = [await ask(s, fleet.url, x) for x in canaried[:3]]
                async with s.get(fleet.admin + "/admin/models") as r:
                    table = (await r.json())["models"]["m"]
        finally:
            stop.set()
            await asyncio.gather(loading, return_exceptions=True)
    before = [r for r in results if r.sent <= returned]
    after = [r for r in results if r.sent > returned]
    print(f"\nrollback: {len(results)} streams, {len(before)} before the PUT returned "
          f"({sum(r.served == V2 for r in before)} on {V2}), {len(after)} after")  # fmt: skip
    assert [r for r in results if r.status != 200 or not r.complete] == []
    assert all(r.served == r.model for r in results)
    assert [r for r in after if r.served != V1] == []
    # the streams under way on the canary ran to their end there, after the PUT returned
    assert [(r.status, r.served, r.complete) for r in held_results] == [(200, V2, True)] * 3
    assert all(r.done > returned for r in held_results)
    # and their sessions now go to v1
    assert [(r.status, r.served) for r in moved] == [(200, V1)] * 3
    assert table["split"] == {V1: 100.0, V2: 0.0}
    assert table["routable_backends"] == {V1: 1, V2: 1}  # v2 still up: only its weight moved


def measure(n: int, v2: float) -> None:
    """N requests with their own sessions, then a tenth again: the split and stickiness."""
    import tempfile

    async def run(fleet: Fleet) -> dict:
        sessions = [f"user-{i}" for i in range(n)]
        started = time.monotonic()
        first = await load(fleet.url, sessions)
        again = await load(fleet.url, sessions[::10])
        report = split_report(fleet, first, again, v2)
        report["failed"] = sum(r.status != 200 for r in first + again)
        report["seconds"] = round(time.monotonic() - started, 1)
        return report

    with tempfile.TemporaryDirectory() as tmp, canary_fleet(Path(tmp), v2) as fleet:
        print(asyncio.run(run(fleet)))


if __name__ == "__main__":
    args = [*sys.argv[1:], "10000", "5"][:2]  # requests, the canary's percentage
    measure(int(args[0]), float(args[1]))
