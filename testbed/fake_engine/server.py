"""A fake inference engine: vLLM's APIs and metrics, timed by the engine model.

Used wherever a real GPU server cannot run: tests, the live benchmark, the demo. Each
request is queued in the same `EngineModel` the simulator uses, run against the wall clock
(optionally `time_scale` times slower so a 2-core machine can host a fleet), and its tokens
are streamed as the model's token clock produces them. `POST /_fault` injects failures.
Chat, completions and embeddings are served here; the Responses, Anthropic Messages,
pooling, audio and tokenizer APIs in the modules testbed/fake_engine/apis.py lists.

An engine spanning `tensor_parallel` GPUs is one engine to the API and /metrics (as a vLLM
with --tensor-parallel-size is); its simulated telemetry (GET /_gpu) lists that many GPUs,
in lockstep, each holding its share of the weights and KV cache."""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
import uuid
from typing import Any

from aiohttp import web
from gpuroute.testbed.fake_engine import payloads
from gpuroute.testbed.fake_engine.apis import api_routes
from gpuroute.testbed.fake_engine.common import OUTPUT_HEADER, continuing, refused_body
from gpuroute.testbed.fake_engine.config import FakeEngineConfig
from gpuroute.testbed.fake_engine.metrics import counter, gauge, vllm_families
from gpuroute.testbed.fake_gpu import SimulatedGpu
from gpuroute.testbed.faults import Faults
from gpuroute.testbed.live_engine import LiveEngine, LiveRequest
from prometheus_client import CollectorRegistry, generate_latest

from gpuroute.openai_api import SSE_DONE, error_response, sse_event
from gpuroute.prompt import estimate_tokens, prefix_blocks, prompt_text, prompt_tokens

# vLLM's (uvicorn's) listen backlog: a burst of new connections (a router opening 200 at
# once) waits to be accepted instead of losing SYNs (aiohttp's default is 128)
VLLM_BACKLOG = 2048

FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")  # vLLM V1's
ENGINE_KEY = web.AppKey("engine", object)
__all__ = ["FakeEngine", "FakeEngineConfig", "run_fake_engine"]


class FakeEngine:
    """Handlers and state of one fake engine; `app()` builds the aiohttp application."""

    def __init__(self, config: FakeEngineConfig) -> None:
        self.config = config
        self.name = config.served_name or config.model
        self.params = config.engine_params()
        self.rng = random.Random(config.seed)
        self.faults = Faults()
        self.faults.resumed.set()
        self.engine: LiveEngine | None = None
        self.created = int(time.time())
        self.errors_injected = 0
        # requests answered in full, by vLLM's finished_reason label (abort: client gone)
        self.finished = dict.fromkeys(FINISHED_REASONS, 0)
        # one GPU of the engine's tensor-parallel group: 1/tp of its weights and KV cache
        tp = self.params.tp
        kv_bytes = self.params.kv_capacity_tokens * self.params.model.kv_bytes_per_token / tp
        self.gpu = SimulatedGpu(
            self.params.gpu, self.params.model.weight_total_bytes / tp, kv_bytes
        )
        # the context a request may use: the model's, unless the KV cache holds less
        longest = self.params.model.max_model_len or self.params.kv_capacity_tokens
        self.max_model_len = min(longest, self.params.kv_capacity_tokens)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)  # collect() below

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app[ENGINE_KEY] = self
        app.on_startup.append(self._start)
        app.add_routes(
            [
                web.post("/v1/chat/completions", self.chat),
                web.post("/v1/completions", self.completions),
                web.post("/v1/embeddings", self.embeddings),
                web.get("/v1/models", self.models),
                web.get("/server_info", self.server_info),
                web.get("/health", self.health),
                web.get("/metrics", self.metrics),
                web.post("/_fault", self.set_fault),
                web.get("/_fault", self.get_fault),
                web.get("/_gpu", self.gpu_state),
                *api_routes(self),  # Responses, Messages, pooling, audio, tokenize
            ]
        )
        return app

    async def _start(self, _app: web.Application) -> None:
        self.engine = LiveEngine(self.params)
        self._apply_speed()

    def _apply_speed(self) -> None:
        assert self.engine is not None
        self.engine.set_slowdown(self.config.time_scale * self.faults.slow * self.faults.throttle)

    # -- OpenAI routes ---------------------------------------------------------------------
    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion")

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        body = await self.admit(request)
        if isinstance(body, web.StreamResponse):
            return body
        raw = body.get("input")
        texts = [raw] if isinstance(raw, str) else raw
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            return error_response(
                400, "'input' must be a string or a list of strings", param="input"
            )
        prompt = sum(estimate_tokens(t) for t in texts)
        live = self.submit(prompt, 1, ())
        if isinstance(live, web.StreamResponse):
            return live
        await live.done
        return web.json_response(payloads.embeddings(self.name, texts, prompt))

    async def models(self, _request: web.Request) -> web.Response:
        return web.json_response(payloads.models_list(self.name, self.created, self.max_model_len))

    async def server_info(self, _request: web.Request) -> web.Response:
        """vLLM's dev-mode /server_info, its parallel layout only (what the agent reads)."""
        parallel = {"tensor_parallel_size": self.params.tp, "pipeline_parallel_size": 1,
                    "data_parallel_size": 1}  # fmt: skip
        return web.json_response({"vllm_config": {"parallel_config": parallel}})

    async def health(self, _request: web.Request) -> web.Response:
        await self.faults.resumed.wait()
        return web.Response(status=200)

    def collect(self):
        """Prometheus collector with vLLM's metric names and labels (V1 engine)."""
        if self.engine is None:
            return
        labels = {"engine": "0", "model_name": self.name}  # vLLM V1's label set
        yield from vllm_families(self.engine, labels, self.finished)
        model = self.engine.model
        yield gauge(
            labels, "gpuroute_fake_gpu_busy_seconds", "Simulated GPU busy time.", model.busy_s
        )
        yield gauge(
            labels, "gpuroute_fake_slowdown", "Current slowdown factor (faults x time scale).",
            model.slowdown,
        )  # fmt: skip
        yield gauge(
            labels, "gpuroute_fake_throttled", "1 while a throttle fault is on.",
            float(self.faults.throttle > 1),
        )  # fmt: skip
        yield counter(
            labels, "gpuroute_fake_errors_injected", "Fast 500s from the error-rate fault.",
            self.errors_injected,
        )  # fmt: skip

    async def gpu_state(self, _request: web.Request) -> web.Response:
        """Simulated NVML-like GPU state, read by the agent's simulated telemetry source."""
        if self.engine is None:
            return error_response(503, "engine starting")
        model = self.engine.model
        state = self.gpu.sample(
            busy=model.num_running + model.num_waiting > 0,
            kv_usage=model.kv_usage(),
            throttled=self.faults.throttle > 1,
            processes=1,
        )
        # a tensor-parallel group's GPUs work in lockstep: each the same, indices 0..tp-1
        (one,) = state["gpus"]
        state["gpus"] = [one | {"index": i} for i in range(self.params.tp)]
        return web.json_response(state)

    async def metrics(self, _request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self.registry), content_type="text/plain", charset="utf-8"
        )

    # -- faults ----------------------------------------------------------------------------
    async def get_fault(self, _request: web.Request) -> web.Response:
        return web.json_response(self.faults.as_dict())

    async def set_fault(self, request: web.Request) -> web.StreamResponse:
        try:
            spec = await request.json()
            if not isinstance(spec, dict):
                raise ValueError("expected a JSON object")
        except ValueError as exc:
            return error_response(400, f"fault body: {exc}")
        try:
            self.faults.apply(spec)
        except (TypeError, ValueError) as exc:
            return error_response(400, str(exc))
        self._apply_speed()
        if spec.get("crash"):
            response = web.json_response({"crashing": True})
            await response.prepare(request)
            await response.write_eof()
            os._exit(1)  # as abrupt as SIGKILL: every connection is reset
        return web.json_response(self.faults.as_dict())

    # -- internals -------------------------------------------------------------------------
    async def admit(
        self, request: web.Request, *, check_model: bool = True
    ) -> dict[str, Any] | web.StreamResponse:
        """Parse and check a request; an error response if it must not run."""
        await self.faults.resumed.wait()  # hang: accept, then never answer
        if self.faults.error_rate and self.rng.random() < self.faults.error_rate:
            self.errors_injected += 1
            return error_response(500, "injected error", code="fault_error_rate")
        try:
            body = json.loads(await request.read())
        except ValueError:
            return error_response(400, "request body is not valid JSON")
        if not isinstance(body, dict):
            return error_response(400, "request body must be a JSON object")
        if check_model and body.get("model") != self.name:
            return error_response(
                404,
                f"The model `{body.get('model')}` does not exist.",
                code="model_not_found",
                param="model",
            )
        return body

    def submit(self, prompt: int, output: int, blocks) -> LiveRequest | web.StreamResponse:
        assert self.engine is not None
        try:
            return self.engine.submit(prompt, output, blocks)
        except ValueError as exc:
            return error_response(400, str(exc), code="context_length_exceeded")

    async def _generate(self, request: web.Request, kind: str) -> web.StreamResponse:
        body = await self.admit(request)
        if isinstance(body, web.StreamResponse):
            return body
        if (refused := refused_body(body, kind)) is not None:
            return refused
        text = prompt_text(body)
        prompt = prompt_tokens(body)  # token ids counted as ids, as an engine does
        cap = body.get("max_completion_tokens") or body.get("max_tokens")
        context = self.max_model_len  # what /v1/models reports
        if isinstance(cap, int) and cap > context:  # as vLLM refuses it (400)
            return error_response(
                400,
                f"max_tokens={cap} cannot be greater than max_model_len={context}. "
                "Please request fewer output tokens.",
                param="max_tokens",
            )
        if (refused := continuing(body)) is not None:
            return refused
        wanted = request.headers.get(OUTPUT_HEADER)
        output = int(wanted) if wanted and wanted.isdigit() else self.config.default_output_tokens
        output -= payloads.already_written(body)  # a continued answer generates what is left of it
        finish = "stop"
        if isinstance(cap, int) and cap > 0 and cap <= output:
            output, finish = cap, "length"
        output = max(1, output)
        live = self.submit(prompt, output, prefix_blocks(text))
        if isinstance(live, web.StreamResponse):
            return live
        rid = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
        if body.get("stream"):
            options = body.get("stream_options") or {}
            include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
            return await self._stream(
                request, live, kind, rid, prompt, output, finish, include_usage, body
            )
        try:
            await live.done
            await self.faults.resumed.wait()
        except asyncio.CancelledError:
            self.engine.cancel(live)
            self.finished["abort"] += 1
            raise
        self.finished[finish] += 1
        build = payloads.chat_completion if kind == "chat" else payloads.completion
        answer = build(rid, self.created, self.name, output, prompt, finish)
        return web.json_response(payloads.with_prompt_extras(answer, body, prompt, output))

    async def _stream(
        self,
        request: web.Request,
        live: LiveRequest,
        kind: str,
        rid: str,
        prompt: int,
        output: int,
        finish: str,
        include_usage: bool,
        body: dict,
    ) -> web.StreamResponse:
        assert self.engine is not None
        engine, name, created = self.engine, self.name, self.created
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )

        ids = payloads.StreamedIds.asked(body, prompt)  # vLLM's return_token_ids

        def chunk(n: int, end: str | None = None) -> bytes:
            text = payloads.tokens_text(n)
            if kind == "chat":
                data = payloads.chat_chunk(rid, created, name, {"content": text}, end)
            else:
                data = payloads.completion_chunk(rid, created, name, text, end)
            return sse_event(ids.add(data, n) if ids else data)

        try:
            await live.first_token
            await response.prepare(request)
            if kind == "chat":
                role = payloads.chat_chunk(rid, created, name, {"role": "assistant", "content": ""})
                role = ids.add(role, 0) if ids else role
                if body.get("return_prompt_text") is True:  # vLLM: on the first chunk
                    role["prompt_text"] = payloads.rendered_prompt(body, prompt)
                await response.write(sse_event(role))
            await self.stream_tokens(response, chunk, live, output)
            await response.write(chunk(0, finish))
            if include_usage:
                obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
                await response.write(
                    sse_event(payloads.usage_chunk(obj, rid, created, name, prompt, output))
                )
            await response.write(SSE_DONE)
            await response.write_eof()
            self.finished[finish] += 1
        except (ConnectionError, asyncio.CancelledError):
            engine.cancel(live)  # client went away
            self.finished["abort"] += 1
            raise
        return response

    async def stream_tokens(self, response, chunk, live: LiveRequest, output: int) -> None:
        """Write `chunk(n)` for a request's tokens as they come (or one per token_interval_s)."""
        if self.config.token_interval_s is None:
            await self._stream_as_generated(response, chunk, live, output)
        else:
            await self._stream_paced(response, chunk, output)

    async def _stream_as_generated(self, response, chunk, live, output: int) -> None:
        """What the simulated GPU has generated, at most one chunk per stream interval."""
        engine, sent = self.engine, 0
        while True:
            await self.faults.resumed.wait()
            done = live.done.done()
            n = output if done else min(engine.tokens_generated(live), output - 1)
            if n > sent:
                await response.write(chunk(n - sent))
                sent = n
            if done:
                return
            interval = max(engine.model.step, self.config.stream_interval_s)
            await asyncio.wait((live.done,), timeout=interval)

    async def _stream_paced(self, response, chunk, output: int) -> None:
        """One token per event, `token_interval_s` apart (a relay benchmark's source)."""
        interval = self.config.token_interval_s
        for i in range(output):
            await self.faults.resumed.wait()
            await response.write(chunk(1))
            if i + 1 < output:
                await asyncio.sleep(interval)  # the pace of the stream, not a synchronisation


def run_fake_engine(config: FakeEngineConfig) -> None:
    """Serve until SIGINT/SIGTERM (aiohttp's runner handles both)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; keep running without it
        uvloop = None
    engine = FakeEngine(config)
    gpus = config.gpu + (f" x {config.tensor_parallel}" if config.tensor_parallel > 1 else "")
    shape = "" if engine.name == config.model else f" ({config.model})"
    print(
        f"fake engine {engine.name}{shape} on {gpus} listening on "
        f"http://{config.host}:{config.port}",
        flush=True,
    )
    web.run_app(
        engine.app(),
        host=config.host,
        port=config.port,
        print=None,
        access_log=None,
        backlog=VLLM_BACKLOG,
        handler_cancellation=True,  # a client that hangs up aborts its request, as in vLLM
        loop=uvloop.new_event_loop() if uvloop else None,
    )
