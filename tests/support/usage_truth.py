"""Usage truth (issue 42 finding 1): each request's usage record, read back from the router,
against the usage its engine answered the same request with, for every API, streamed and
not, with each body field vLLM can add around `usage`."""

from __future__ import annotations

import json

import aiohttp

from support.live import async_wait_for

EXTRAS = {
    "plain": {},
    "return_token_ids": {"return_token_ids": True},
    "prompt_logprobs": {"prompt_logprobs": 1},
    "return_prompt_text": {"return_prompt_text": True},
    "all": {"return_token_ids": True, "prompt_logprobs": 1, "return_prompt_text": True},
}
GENERATING = {
    "/v1/chat/completions": lambda text, n: {"messages": [{"role": "user", "content": text}],
                                             "max_tokens": n},
    "/v1/completions": lambda text, n: {"prompt": text, "max_tokens": n},
    "/v1/responses": lambda text, n: {"input": text, "max_output_tokens": n},
    "/v1/messages": lambda text, n: {"messages": [{"role": "user", "content": text}],
                                     "max_tokens": n},
}  # fmt: skip
POOLING = {
    "/v1/embeddings": lambda text: {"input": [text, "a second one", text]},
    "/v1/rerank": lambda text: {"query": "which", "documents": [text, "short", text]},
}


def usage_cases(
    model: str, texts: tuple[str, ...], *, pooling: bool = True, output: int = 9, **common
) -> list[tuple[str, dict]]:
    """(route, body) for each API, streamed and not, with each extra, for each text."""
    cases = []
    for text in texts:
        for route, make in GENERATING.items():
            for stream in (False, True):
                for extra in EXTRAS.values():
                    body = {"model": model, "stream": stream, **make(text, output), **extra}
                    cases.append((route, body | common))
        if pooling:
            cases += [(route, {"model": model, **make(text)}) for route, make in POOLING.items()]
    return cases


def engine_usage(status: int, raw: bytes) -> tuple[int, int]:
    """(prompt, completion) as the engine's own answer says, read plainly (json.loads of
    the body or of every event): nothing of the router's reader."""
    if status != 200:
        return 0, 0
    if not raw.lstrip().startswith(b"{"):  # a stream
        usage: dict = {}
        for event in raw.decode().split("\n\n"):
            data = "".join(line[6:] for line in event.splitlines() if line.startswith("data: "))
            if not data or data == "[DONE]":
                continue
            chunk = json.loads(data)
            for found in (chunk.get("usage"), (chunk.get("response") or {}).get("usage"),
                          (chunk.get("message") or {}).get("usage")):  # fmt: skip
                usage |= {k: v for k, v in (found or {}).items() if v is not None}
    else:
        usage = json.loads(raw)["usage"]
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    return prompt, usage.get("completion_tokens", usage.get("output_tokens", 0))


async def recorded(s: aiohttp.ClientSession, admin: str) -> tuple[int, int, int]:
    """The router's usage record over every tenant: (requests, prompt, completion)."""
    async with s.get(admin + "/admin/usage?since=1h") as r:
        total = (await r.json())["total"]
    return total["requests"], total["prompt_tokens"], total["completion_tokens"]


async def usage_truth(
    s: aiohttp.ClientSession, router: str, engine: str, cases: list[tuple[str, dict]]
) -> tuple[list[tuple], int]:
    """Send each case to the engine, then through the router (admin on its public
    listener); (the cases whose record or status differs from the engine's, the 200s)."""
    wrong, served = [], 0
    for route, body in cases:
        asked = body.get("stream") and "completions" in route  # usage, as the router asks
        direct = body | ({"stream_options": {"include_usage": True}} if asked else {})
        async with s.post(engine + route, json=direct) as r:
            status, theirs = r.status, engine_usage(r.status, await r.read())
        before = await recorded(s, router)
        async with s.post(router + route, json=body) as r:
            await r.read()

        async def counted(before: tuple[int, int, int] = before) -> bool:
            return (await recorded(s, router))[0] > before[0]

        await async_wait_for(counted, what=f"{route} recorded")
        after = await recorded(s, router)
        ours = (after[1] - before[1], after[2] - before[2])
        served += r.status == 200
        if ours != theirs or r.status != status or (theirs == (0, 0) and status == 200):
            extras = sorted(set(body) & {k for e in EXTRAS.values() for k in e})
            wrong.append((route, body.get("stream"), extras, r.status, status, ours, theirs))
    return wrong, served
