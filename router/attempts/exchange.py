"""One client request on its way through the forwarder's attempts."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import orjson
from aiohttp import web
from gpuroute.router.core.backend import Backend
from gpuroute.router.core.lifetime import Event, RequestLifetime
from gpuroute.router.core.request import RequestInfo
from gpuroute.router.responses.state import RESPONSES, TURN

from gpuroute.audio_duration import reported_seconds
from gpuroute.headers import SERVED_MODEL_HEADER
from gpuroute.relay.body import RESPONSE_DROP, ResponseTally, forward_headers
from gpuroute.relay.strip import StrippingTally

NO_BACKEND = "no healthy backend can serve this model now"


@dataclass(slots=True)
class Answer:
    """What an engine's answer, relayed to the client, says about its cost."""

    status: int
    streamed: bool
    tally: ResponseTally
    backend: str | None = None  # who answered (the access log's `backend`)
    _usage: tuple[int | None, int | None] | None = None

    def usage(self) -> tuple[int | None, int | None]:
        """The engine's reported (prompt, completion) tokens, read once (the
        token counter, the quota settle and the access log all ask)."""
        if self._usage is None:
            self._usage = self.tally.reported()
        return self._usage

    def audio_seconds(self) -> float | None:
        """Seconds of audio the engine says it transcribed (a transcription's usage), or
        None: what settles an audio upload's charge."""
        return reported_seconds(self.tally.usage)

    def output_tokens(self) -> int:
        """Its output tokens: the engine's usage, else a stream's estimate (0 for a whole
        answer without usage)."""
        completion = self.usage()[1]
        if completion is not None:
            return completion
        return self.tally.estimated_output() if self.streamed else 0

    def used_tokens(self, prompt_estimate: int) -> int | None:
        """Tokens it used: the engine's usage, else a stream's estimate; an error answer
        without usage used none; None when a whole answer does not say."""
        used = self.tally.used_tokens(self.streamed, prompt_estimate, self.usage())
        if used is None and self.status >= 400:
            return 0
        return used


@dataclass(slots=True)
class Exchange:
    """One client request on its way through the attempts: what every attempt sends, and
    what the answer is measured against."""

    request: web.Request
    life: RequestLifetime  # everything booked for it (router/core/lifetime.py)
    raw: bytes
    route: str
    arrival: float
    headers: dict[str, str]  # forwarded upstream, the same every attempt
    # backends that answered this request with a 5xx: judged only once another backend
    # answers it below 500 (a request that breaks every engine is the client's doing)
    suspects: list[Backend] = field(default_factory=list)
    dispatched: float = 0.0  # when the current attempt was sent
    first_at: float | None = None  # when its first bytes reached the client
    first_token_at: float | None = None  # when its first generated text did
    answer: Answer | None = None  # the answer relayed to the client, if one was
    ending: Event = Event.FAIL  # how the request ends, once the attempts are over
    # the body as parsed at admission (None: not JSON, an audio upload); `edited`: it no
    # longer says what `raw` does (a Responses turn's conversation, usage asked for on the
    # client's behalf: `strip_usage`, that chunk not relayed), so it is what is sent
    body: dict | None = None
    edited: bool = False
    strip_usage: bool = False
    strip_token_ids: bool = (
        False  # asked for to continue it exactly (gpuroute/continuation/text.py)
    )
    continuable: bool = False  # a stream that may go on elsewhere if its engine breaks
    continuation: bytes | None = None  # what continues a broken stream (StreamContinuer)
    continuation_route: str | None = None  # where it goes (a chat may go on as a completion)
    # a continued stream: when its continuation's first bytes came, and the tokens before
    resumed: tuple[float, int] | None = None
    _sent: tuple[str, bytes] | None = None  # the last body serialised, for its model

    @property
    def info(self) -> RequestInfo:
        return self.life.info

    @property
    def target(self) -> str:
        """The engine path: the client's, unless its continuation goes on elsewhere."""
        return self.continuation_route or self.request.path_qs

    def new_tally(self, streamed: bool) -> ResponseTally:
        """What counts an attempt's answer (a Responses turn's also reads the response to
        store: router/responses/state.py)."""
        # (a stream that may be continued is held in whole events, so that an engine's
        # error event breaks it instead of reaching the client)
        if streamed and (self.strip_usage or self.continuable):
            return StrippingTally(usage=self.strip_usage, token_ids=self.strip_token_ids)
        turn = self.request.get(TURN) if self.route == RESPONSES else None
        return ResponseTally(size_text=streamed) if turn is None else turn.tally(streamed)

    def engine_share(self, output: int) -> tuple[float | None, int]:
        """What the engine that finished it did, to judge that engine by: from its first
        bytes, its own tokens (of a continued stream, the continuation's alone)."""
        if self.resumed is None:
            return self.first_at, output
        return self.resumed[0], max(output - self.resumed[1], 0)

    def body_for(self, model: str) -> bytes:
        """The body to send for `model`: as it came when that is the model the client named
        and nothing was edited, else the parsed body with `model` set (an alias, a split's
        version, a fallback), serialised once per model. A multipart upload goes as it
        came (its model field unchanged)."""
        if self.continuation is not None:
            return self.continuation
        body = self.body
        if body is None or (model == self.info.requested and not self.edited):
            return self.raw
        if self._sent is None or self._sent[0] != model:
            body["model"] = model
            self._sent = (model, orjson.dumps(body))
        return self._sent[1]


BACKEND_HEADER = "x-gpuroute-backend"  # who served it, with expose_backend_header only


def answer_headers(
    upstream: Iterable[tuple[str, str]], served_model: str, backend_id: str | None
) -> dict[str, str]:
    """An answer's headers: the engine's less hop-by-hop ones, the model that served it
    (a passthrough request names none), and the backend where it is shown."""
    headers = forward_headers(upstream, RESPONSE_DROP)
    if served_model:
        headers[SERVED_MODEL_HEADER] = served_model
    if backend_id is not None:
        headers[BACKEND_HEADER] = backend_id
    return headers
