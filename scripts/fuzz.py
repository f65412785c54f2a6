"""Fuzz the request parser, the Authorization parser and the config loaders with hypothesis,
then throw the parser's inputs at a live router: no traceback, no 5xx, the router healthy.

A benchmark-style run, not a CI test (it takes minutes):

    .venv/bin/python scripts/fuzz.py --examples 10000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from gpuroute.router.api.table import APIS
from gpuroute.router.config.router import load_router_config
from gpuroute.router.front.parse import RequestError, parse_request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuroute.auth import AuthError, client_key
from gpuroute.config import ConfigError

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
BODY_KEYS = st.sampled_from(
    [
        "model",
        "messages",
        "prompt",
        "input",
        "stream",
        "max_tokens",
        "max_completion_tokens",
        "user",
        "query",
        "documents",
        "text_1",
        "text_2",
        "tokens",
        "instructions",
        "max_output_tokens",
        "system",
        "background",
        "tools",
        "previous_response_id",
    ]
)
BODIES = st.one_of(
    st.binary(max_size=200),
    st.dictionaries(BODY_KEYS, JSON_VALUES, max_size=6).map(lambda d: json.dumps(d).encode()),
)
HEADER_VALUES = st.text(max_size=40)
HEADERS = st.dictionaries(
    st.sampled_from(
        ["x-gpuroute-priority", "x-gpuroute-deadline-ms", "x-session-id", "x-gpuroute-session"]
    ),
    HEADER_VALUES,
    max_size=3,
)
CONFIG_KEYS = st.sampled_from(
    ["policy", "listen", "admin_listen", "limits", "auth", "redis", "backends", "membership",
     "passthrough_paths", "admin_on_public_listener", "engine_api_key_file", "region"]
)  # fmt: skip


def count(counter: dict, key: str) -> None:
    counter[key] = counter.get(key, 0) + 1


def fuzz_parsers(examples: int) -> dict:
    outcomes: dict[str, int] = {}
    conf = settings(max_examples=examples, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))  # fmt: skip

    @conf
    @given(st.sampled_from(sorted(APIS)), BODIES, HEADERS)
    def parse(route: str, raw: bytes, headers: dict) -> None:
        kind = "multipart/form-data; boundary=b" if route.startswith("/v1/audio") else None
        try:
            parse_request(route, raw, headers, 1, priorities=("high", "normal", "low"),
                          default_priority="normal", content_type=kind)  # fmt: skip
            count(outcomes, "request ok")
        except RequestError as exc:
            assert 400 <= exc.status < 500
            count(outcomes, "request 4xx")

    @conf
    @given(st.one_of(st.none(), st.text(max_size=80)), st.one_of(st.none(), st.text(max_size=80)))
    def authorization(header: str | None, api_key: str | None) -> None:
        headers = {k: v for k, v in (("authorization", header), ("x-api-key", api_key)) if v}
        try:
            client_key(headers)
            count(outcomes, "authorization ok")
        except AuthError as exc:
            assert exc.status in (400, 401)
            count(outcomes, "authorization 4xx")

    @conf
    @given(st.dictionaries(CONFIG_KEYS, JSON_VALUES, max_size=5))
    def config(data: dict) -> None:
        import tomli_w

        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "router.toml"
            try:
                path.write_bytes(tomli_w.dumps(data).encode())
            except (TypeError, ValueError):  # not representable as TOML (None, NaN keys)
                path.write_text(str(data))
            try:
                load_router_config(path)
                count(outcomes, "config ok")
            except ConfigError:
                count(outcomes, "config error")

    for test in (parse, authorization, config):
        started = time.monotonic()
        test()
        print(f"{test.__name__}: {examples} examples in {time.monotonic() - started:.1f} s")
    return outcomes


async def fuzz_live(requests: int, seed: int) -> dict:
    """Random bodies and headers at a router in front of a fake engine."""
    import aiohttp
    from gpuroute.router.http.server import RouterApp
    from gpuroute.router.process import RouterServer
    from gpuroute.testbed.fake_engine.server import FakeEngine  # noqa: F401 (the engine is a child)

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from support.live import FakeEngineProcess

    rng = random.Random(seed)
    engine = FakeEngineProcess("H100", time_scale=0.01)
    statuses: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "router.toml"
        path.write_text(
            "[listen]\nport = 0\n[admin_listen]\nport = 0\n"
            f'[[backends]]\nurl = "{engine.url}"\ngpu = "H100"\nmodels = ["llama-3.1-8b"]\n'
        )
        server = RouterServer(RouterApp(load_router_config(path)))
        await server.start()
        base = f"http://127.0.0.1:{server.port}"
        try:
            async with aiohttp.ClientSession() as s:
                for _ in range(requests):
                    route = rng.choice([*sorted(APIS), "/v1/models", "/x"])
                    raw = BODIES.example() if rng.random() < 0.5 else _valid(rng)
                    # an HTTP client cannot send control characters; every other byte goes
                    headers = {
                        k: "".join(c for c in v if c.isprintable()).encode().decode("latin-1")
                        for k, v in HEADERS.example().items()
                    }
                    async with s.post(base + route, data=raw, headers=headers) as r:
                        await r.read()
                        count(statuses, str(r.status))
                async with s.get(base + "/readyz") as r:
                    assert r.status == 200, "router unhealthy after fuzzing"
        finally:
            await server.drain(timeout=2)
            engine.stop()
    return statuses


def fuzz_atheris(runs: int) -> None:
    """Coverage-guided fuzzing of the request and Authorization parsers with atheris
    (libFuzzer), when it is installed (`pip install atheris`; not a project dependency).
    libFuzzer ends the process itself after `runs` inputs."""
    import atheris

    priorities = ("high", "normal", "low")
    routes = sorted(APIS)

    def one_input(data: bytes) -> None:
        fdp = atheris.FuzzedDataProvider(data)
        route = fdp.PickValueInList(routes)
        headers = {"x-gpuroute-priority": fdp.ConsumeUnicode(20),
                   "x-session-id": fdp.ConsumeUnicode(40),
                   "x-gpuroute-deadline-ms": fdp.ConsumeUnicode(12)}  # fmt: skip
        authorization = fdp.ConsumeUnicode(80)
        if fdp.ConsumeBool():  # a JSON object with the fields the parser reads, odd values
            fields = {"model": fdp.ConsumeUnicode(12), "stream": fdp.ConsumeBool(),
                      "max_tokens": fdp.ConsumeIntInRange(-3, 10**6),
                      "messages": [{"role": "user", "content": fdp.ConsumeUnicode(60)}],
                      "prompt": fdp.ConsumeUnicode(20), "input": fdp.ConsumeUnicode(20),
                      "user": fdp.ConsumeUnicode(20)}  # fmt: skip
            keep = fdp.ConsumeIntInRange(0, 127)
            body = {k: v for i, (k, v) in enumerate(fields.items()) if keep >> i & 1}
            raw = json.dumps(body).encode()
        else:
            raw = fdp.ConsumeBytes(fdp.remaining_bytes())
        try:
            parse_request(route, raw, headers, 1, priorities=priorities, default_priority="normal")
        except RequestError as exc:
            assert 400 <= exc.status < 500
        try:
            client_key({"authorization": authorization, "x-api-key": authorization[::-1]})
        except AuthError as exc:
            assert exc.status in (400, 401)

    atheris.instrument_all()
    atheris.Setup([sys.argv[0], f"-runs={runs}", "-max_len=2048"], one_input)
    atheris.Fuzz()


def _valid(rng: random.Random) -> bytes:
    message = {"role": "user", "content": "hi" * rng.randint(1, 50)}
    body = {"model": "llama-3.1-8b", "messages": [message],
            "max_tokens": rng.randint(1, 16), "stream": rng.random() < 0.5}  # fmt: skip
    return json.dumps(body).encode()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=10_000)
    parser.add_argument("--live", type=int, default=2_000, help="requests at a live router")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--atheris", type=int, default=0, metavar="RUNS",
        help="instead: coverage-guided fuzzing with atheris for RUNS inputs (needs atheris)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.atheris:
        fuzz_atheris(args.atheris)
    outcomes = fuzz_parsers(args.examples) if args.examples else {}
    statuses = asyncio.run(fuzz_live(args.live, args.seed))
    print(json.dumps({"parsers": outcomes, "live_statuses": statuses}, indent=2))
    server_errors = sum(n for s, n in statuses.items() if s.startswith("5"))
    print(f"5xx answers: {server_errors}")
    return 1 if server_errors else 0


if __name__ == "__main__":
    sys.exit(main())
