"""The Responses API's conversation state, kept by the router rather than by one engine.

vLLM keeps stored responses in one server's memory: `previous_response_id` and
`GET /v1/responses/{id}` work only on that server, and die with it. Here:
- before a /v1/responses request is parsed (`expand`), a `previous_response_id` of the
  caller's tenant is replaced by the conversation it ends (its stored input items and
  output items, then the new input), and the engine is told `store: false`: the request
  can go to any backend, and its cost and prefix blocks cover the whole conversation (so
  prefix affinity prefers the backend that holds it);
- as the answer is relayed, its finished response object is read (CapturedAnswer) and
  stored under its tenant and id, with the conversation's input items, unless the client
  sent `store: false`; its `previous_response_id` is the one the client sent (the answer
  relayed to the client is the engine's: it shows none, and `store: false`).
Stored responses live in router/responses/store.py (Redis, else this process)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from aiohttp import web
from gpuroute.router.config.responses import ResponsesConfig
from gpuroute.router.config.router import RouterConfig
from gpuroute.router.responses.capture import CapturedAnswer
from gpuroute.router.responses.redis_store import RedisResponses
from gpuroute.router.responses.store import ResponsesStore, StoredResponse, StoreUnavailable
from gpuroute.router.shared.quotas import KeyPolicy

from gpuroute.openai_api import Rejection, clip
from gpuroute.relay.body import ResponseTally

log = logging.getLogger("gpuroute.router.responses")
RESPONSES = "/v1/responses"


@dataclass(slots=True)
class Turn:
    """One /v1/responses request: whose, what it continues, and what to store after it."""

    tenant: str
    previous_id: str | None  # as the client sent it
    store: bool  # as the client asked (the engine is always told false)
    input: list[Any]  # the input items after expansion: the conversation before its answer
    on_done: Callable[[Turn, dict[str, Any]], Awaitable[None] | None]
    limit: int  # bytes of an answer read, at most
    stored: asyncio.Task | None = field(default=None, repr=False)

    def tally(self, streamed: bool) -> ResponseTally:
        """The relay's tally for its answer: one that captures the finished response when
        it is to be stored."""
        if not self.store:
            return ResponseTally(size_text=streamed)
        return CapturedAnswer(streamed, self.limit, lambda response: self.on_done(self, response))


TURN = web.RequestKey("gpuroute.responses_turn", Turn)


def as_items(value: Any) -> list[Any]:
    """A Responses `input` as a list of items (a string is one user message)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return list(value) if isinstance(value, list) else []


def not_found(rid: str, param: str = "response_id") -> Rejection:
    """As an unknown id is answered, whoever's it is."""
    message = f"Response with id '{clip(rid)}' not found."
    return Rejection(404, message, code="response_not_found", param=param)


UNAVAILABLE = "stored responses cannot be read now (Redis is unavailable); retry shortly"


class ResponsesState:
    def __init__(self, config: ResponsesConfig, store: ResponsesStore) -> None:
        self.config, self.store = config, store
        self.writing: dict[tuple[str, str], asyncio.Task] = {}  # stores on their way

    @classmethod
    def from_config(
        cls,
        config: RouterConfig,
        client: aioredis.Redis | None,
        workers: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> ResponsesState | None:
        """The state (None: `responses.enabled = false`): in Redis when a client is given,
        else in this process (then each of several workers keeps its own: a follow-up
        reaching another worker finds nothing, so that is warned of)."""
        responses, redis = config.responses, config.redis
        if not responses.enabled:
            return None
        shared = None
        if client is not None:
            shared = RedisResponses(
                client, prefix=redis.prefix, ttl_s=responses.ttl_s,
                max_count=responses.max_per_tenant, max_bytes=responses.max_bytes_per_tenant,
            )  # fmt: skip
        elif workers > 1:
            log.warning("responses: %d workers without [redis] each keep their own stored "
                        "responses; configure [redis] to share them", workers)  # fmt: skip
        store = ResponsesStore(responses, shared, retry_s=redis.retry_s, clock=clock)
        return cls(responses, store)

    # -- before a request is parsed -------------------------------------------------------
    async def expand(self, request: web.Request, key: KeyPolicy, body: dict[str, Any]) -> None:
        """Edit a /v1/responses body (parsed once, by the front) into the one to price,
        schedule and forward: its previous response's conversation prepended to its input,
        `store: false`."""
        store, previous = self._read_fields(body)
        items = as_items(body.get("input"))
        if previous is not None:
            before = await self.find(key.tenant, previous, param="previous_response_id")
            if items:  # no input: the parser refuses it, as it came
                items = [*before.conversation(), *items]
                body["input"] = items
        body.pop("previous_response_id", None)  # the engine gets the conversation instead
        body["store"] = False  # the router stores; the engine need not
        limit = self.config.max_entry_bytes
        request[TURN] = Turn(key.tenant, previous, store, items, self._completed, limit)

    @staticmethod
    def _read_fields(body: dict[str, Any]) -> tuple[bool, str | None]:
        """`store` and `previous_response_id`, checked; the conversations API refused."""
        if body.get("conversation") is not None:
            raise Rejection(400, "the conversations API is not supported by gpuroute; continue "
                            "with previous_response_id", param="conversation")  # fmt: skip
        store = body.get("store", True)
        if not isinstance(store, bool):
            raise Rejection(400, "'store' must be a boolean", param="store")
        previous = body.get("previous_response_id")
        if previous is not None and (not isinstance(previous, str) or not previous):
            raise Rejection(400, "'previous_response_id' must be a response id (a string)",
                            param="previous_response_id")  # fmt: skip
        return store, previous

    async def find(self, tenant: str, rid: str, param: str = "response_id") -> StoredResponse:
        """`tenant`'s stored response `rid`, or the Rejection to answer with: 404 for an
        unknown id and for another tenant's alike, 503 when the store cannot say."""
        writing = self.writing.get((tenant, rid))
        if writing is not None:  # its answer reached the client before the store did
            await asyncio.shield(writing)
        try:
            entry = await self.store.get(tenant, rid)
        except StoreUnavailable:
            raise Rejection(503, UNAVAILABLE, code="store_unavailable",
                            headers={"Retry-After": "1"}) from None  # fmt: skip
        if entry is None:
            raise not_found(rid, param)
        return entry

    # -- as an answer is relayed -----------------------------------------------------------
    def _completed(self, turn: Turn, response: dict[str, Any]) -> Awaitable[None] | None:
        """A finished response was read from the answer (its last bytes not yet written to
        the client): stored now, in the background, its id marked as being written."""
        if turn.stored is not None:
            return None
        response = response | {"previous_response_id": turn.previous_id}
        entry = StoredResponse(response, turn.input, turn.tenant, time.time())
        where = (turn.tenant, entry.id)
        task = asyncio.get_running_loop().create_task(self._put(entry))
        turn.stored = self.writing[where] = task
        task.add_done_callback(lambda _: self.writing.pop(where, None))
        return asyncio.shield(task)  # its last bytes wait for it: any replica then reads it

    async def _put(self, entry: StoredResponse) -> None:
        try:
            await self.store.put(entry)
        except Exception:  # a bug here must not surface as an unretrieved task error
            log.exception("storing response %.40r failed", entry.id)

    async def close(self, timeout_s: float = 2.0) -> None:
        """Let stores on their way land (a drain's last answers), for a bounded time."""
        if self.writing:
            await asyncio.wait(set(self.writing.values()), timeout=timeout_s)
