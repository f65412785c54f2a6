"""Open-loop trace replay against an OpenAI-compatible endpoint, measuring each request.

Requests are sent at the workload's arrival times whatever the target's state (open loop:
a slow target faces a growing backlog, as in production). Prompts are synthetic text of the
trace's length (4 characters per token); Mooncake block ids become shared 2048-character
blocks so equal prefixes really are equal. The true output length travels in a header only
the fake engine reads: routers see no more than a real client would send."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp
import orjson
from gpuroute.sim.workloads import Workload
from gpuroute.testbed.fake_engine.server import OUTPUT_HEADER

from gpuroute.headers import SERVED_MODEL_HEADER
from gpuroute.prompt import BLOCK_CHARS, CHARS_PER_TOKEN

BACKEND_HEADER = "x-gpuroute-backend"
SLO_HEADER = "x-gpuroute-slo"  # the SLO class a request asks for (router/front/slo.py)


@dataclass(slots=True)
class RequestResult:
    index: int
    sent_at: float  # seconds since the replay started
    ok: bool = False
    status: int = 0
    ttft_s: float = float("nan")
    e2e_s: float = float("nan")
    output_tokens: int = 0
    backend: str | None = None
    error: str | None = None
    served_model: str | None = None  # our router's x-gpuroute-served-model (a fallback's)
    max_gap_s: float = 0.0  # a stream's longest silence between two chunks (a continuation's pause)


def prompt_for(index: int, tokens: int, blocks: tuple[int, ...] = ()) -> str:
    """Text of `tokens` tokens; leading Mooncake blocks are shared, the rest is unique."""
    parts = []
    for block in blocks:
        label = f"[block {block}]"
        parts.append(label + "." * (BLOCK_CHARS - len(label)))
    text = "".join(parts)[: tokens * CHARS_PER_TOKEN]
    unique = f" request {index} "
    need = tokens * CHARS_PER_TOKEN - len(text)
    if need > 0:
        text += (unique * (need // len(unique) + 1))[:need]
    return text


class Replay:
    def __init__(
        self,
        base_url: str | list[str],
        workload: Workload,
        model: str,
        *,
        stream: bool = True,
        request_timeout_s: float = 900.0,
        on_progress: Callable[[int], None] | None = None,
        headers: dict[str, str] | None = None,
        models: Sequence[str] | None = None,
        slo_classes: Sequence[str] | None = None,
    ) -> None:
        """`models`: each request's model (else `model` for all); `slo_classes`: each
        request's SLO class, sent in x-gpuroute-slo (else none is sent)."""
        # several URLs: requests go round robin over them, as a layer-4 balancer in front of
        # router replicas would send them
        urls = [base_url] if isinstance(base_url, str) else base_url
        self.base_urls = [u.rstrip("/") for u in urls]
        self.base_url = self.base_urls[0]
        self.workload = workload
        self.model = model
        self.stream = stream
        self.timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        self.on_progress = on_progress
        self.headers = headers or {}  # e.g. a tenant's Authorization
        for name, per in (("models", models), ("slo_classes", slo_classes)):
            if per is not None and len(per) < len(workload):
                raise ValueError(f"{name}: {len(per)} for {len(workload)} requests")
        self.models, self.slo_classes = models, slo_classes
        self.results: list[RequestResult] = []
        self._t0 = 0.0
        self.started_wall = 0.0

    async def run(self, stop_sending_after_s: float | None = None) -> list[RequestResult]:
        workload = self.workload
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        async with aiohttp.ClientSession(connector=connector, timeout=self.timeout) as session:
            self._t0 = time.monotonic()
            self.started_wall = time.time()  # to line up with the router's decision log
            start = float(workload.arrivals[0]) if len(workload) else 0.0
            tasks = []
            for i in range(len(workload)):
                at = float(workload.arrivals[i]) - start
                if stop_sending_after_s is not None and at > stop_sending_after_s:
                    break
                delay = at - (time.monotonic() - self._t0)
                if delay > 0:
                    await asyncio.sleep(delay)  # pacing of an open-loop generator
                result = RequestResult(i, time.monotonic() - self._t0)
                self.results.append(result)
                tasks.append(asyncio.create_task(self._one(session, result)))
                if self.on_progress is not None:
                    self.on_progress(i + 1)
            await asyncio.gather(*tasks)
        return self.results

    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    async def _one(self, session: aiohttp.ClientSession, result: RequestResult) -> None:
        i = result.index
        w = self.workload
        blocks = tuple(w.blocks[i]) if w.blocks else ()
        text = prompt_for(i, int(w.prompts[i]), blocks)
        model = self.model if self.models is None else self.models[i]
        body = {"model": model, "messages": [{"role": "user", "content": text}]}
        if self.stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        headers = {"Content-Type": "application/json", OUTPUT_HEADER: str(int(w.outputs[i]))}
        if self.slo_classes is not None:
            headers[SLO_HEADER] = self.slo_classes[i]
        headers |= self.headers
        started = time.monotonic()
        try:
            async with session.post(
                self.base_urls[i % len(self.base_urls)] + "/v1/chat/completions",
                data=orjson.dumps(body),
                headers=headers,
            ) as response:
                result.status = response.status
                result.backend = response.headers.get(BACKEND_HEADER)
                result.served_model = response.headers.get(SERVED_MODEL_HEADER)
                if self.stream:
                    tail, last = b"", 0.0
                    async for chunk in response.content.iter_any():
                        now = time.monotonic()
                        if not tail:
                            result.ttft_s = now - started
                        else:
                            result.max_gap_s = max(result.max_gap_s, now - last)
                        tail, last = (tail + chunk)[-4096:], now
                else:
                    tail = await response.read()
                    result.ttft_s = time.monotonic() - started
                result.e2e_s = time.monotonic() - started
                self._judge(result, tail)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            result.error = f"{type(exc).__name__}: {exc}"[:200]
            result.e2e_s = time.monotonic() - started

    def _judge(self, result: RequestResult, tail: bytes) -> None:
        if result.status != 200:
            result.error = f"status {result.status}: {tail[:200].decode(errors='replace')}"
            return
        if self.stream:
            if not tail.endswith(b"data: [DONE]\n\n") or b'"error"' in tail[-600:]:
                result.error = "stream ended without [DONE] or with an error event"
                return
        else:
            try:
                orjson.loads(tail)
            except orjson.JSONDecodeError:
                result.error = "truncated JSON body"
                return
        result.ok = True
        result.output_tokens = int(self.workload.outputs[result.index])
