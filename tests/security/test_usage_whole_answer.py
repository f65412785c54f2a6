"""Usage read from the whole answer (issue 42 finding 1). vLLM puts `prompt_logprobs`,
`prompt_token_ids` (and `prompt_text`) after `usage` in a whole chat answer; with
`return_token_ids` and a prompt of ~250 tokens or more, usage fell out of the 1,024-byte
tail the router read it from: the usage record got 0 tokens and the token charge was never
settled (a 3,000 TPM key was served 10,000 tokens in 2 s)."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from gpuroute.testbed.real_vllm import engine_samples
from support.live import MODEL, FakeEngineProcess, router_server
from support_security import KEY, keys_section, secure_toml

pytestmark = pytest.mark.asyncio

AUTH = {"Authorization": f"Bearer {KEY}"}
TPM = 3000
OUTPUT = 2500  # what the engine generates without max_tokens: more than the charge (1,024)
LONG = "route this request well please " * 60  # about 470 tokens: its ids pass the 1 KB
COUNTERS = {"prompt_tokens": "vllm:prompt_tokens_total",
            "completion_tokens": "vllm:generation_tokens_total"}  # fmt: skip


async def recorded(s: aiohttp.ClientSession, admin: str) -> dict[str, int]:
    """The tenant's usage record, as billing reads it."""
    async with s.get(admin + "/admin/usage?since=1h") as r:
        assert r.status == 200, await r.text()
        sums = (await r.json())["tenants"].get("acme", {})
    return {k: sums.get(k, 0) for k in COUNTERS}


async def test_token_ids_after_usage_neither_hide_it_nor_escape_the_quota(tmp_path) -> None:
    engine = FakeEngineProcess("H100", time_scale=0.01,
                               extra=("--default-output-tokens", str(OUTPUT)))  # fmt: skip
    try:
        text = secure_toml(engine.url, auth=keys_section(f"tokens_per_minute = {TPM}"))
        async with router_server(text, tmp_path) as server, aiohttp.ClientSession() as s:
            base = f"http://127.0.0.1:{server.port}/v1/chat/completions"
            body = {"model": MODEL, "messages": [{"role": "user", "content": LONG}],
                    "return_token_ids": True}  # no max_tokens  # fmt: skip
            statuses, started = [], time.monotonic()
            while time.monotonic() - started < 2.0 and len(statuses) < 10:
                async with s.post(base, json=body, headers=AUTH) as r:
                    answer = await r.json()
                    statuses.append(r.status)
                if r.status == 200:
                    assert answer["prompt_token_ids"] and answer["usage"]["prompt_tokens"] > 250
            elapsed = time.monotonic() - started
            ours = await recorded(s, f"http://127.0.0.1:{server.admin_port}")
        theirs = await asyncio.to_thread(engine_samples, engine.url)
    finally:
        engine.stop()
    served = {k: int(theirs.get(name, 0)) for k, name in COUNTERS.items()}
    assert statuses[0] == 200 and 429 in statuses, statuses
    assert ours == served, (ours, served)  # the record is the engine's usage, exactly
    assert sum(served.values()) <= TPM + TPM / 60 * elapsed, (served, statuses)
