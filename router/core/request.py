"""What the scheduler knows about a request before it runs."""

from __future__ import annotations

from gpuroute.router.core.slo import SloClass


class RequestInfo:
    """A request as the scheduler sees it: sizes, identity hints and service class.

    `prefix_blocks` are hashes of consecutive 512-token prompt blocks (chained, so equal
    leading hashes mean an equal prefix). Output length is unknown; `max_tokens` caps it.
    """

    __slots__ = (
        "adapter",
        "arrived_at",
        "client_request_id",
        "deadline",
        "fallbacks",
        "holds",
        "max_tokens",
        "model",
        "prefix_blocks",
        "priority",
        "prompt_tokens",
        "request_id",
        "requested",
        "session_id",
        "slo",
        "tenant",
    )

    def __init__(
        self,
        request_id: int | str,
        model: str,
        prompt_tokens: int,
        max_tokens: int | None = None,
        *,
        session_id: str | None = None,
        prefix_blocks: tuple[int, ...] | list[int] = (),
        priority: str = "normal",
        deadline: float | None = None,
        tenant: str | None = None,
        slo: SloClass | None = None,
        arrived_at: float | None = None,
        fallbacks: tuple[str, ...] = (),
        requested: str | None = None,
        adapter: str | None = None,
        holds: bool = True,
    ) -> None:
        self.adapter = adapter  # the LoRA adapter it names (its `model` there), else None
        self.slo = slo  # the class it should meet; None: the scheduler's default
        self.arrived_at = arrived_at  # when its TTFT clock started (None: at routing)
        self.tenant = tenant  # set from the API key; fair queuing is per tenant
        self.client_request_id: str | None = None  # the client's x-request-id, if it sent one
        self.request_id = request_id
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.session_id = session_id
        self.prefix_blocks = prefix_blocks
        self.priority = priority
        self.deadline = deadline
        # models that may serve it instead when `model` cannot meet its SLO or has no
        # healthy backend, in order (router/core/model_routes.py); `requested` is the name
        # the client sent when an alias or a split changed it
        self.fallbacks = fallbacks
        self.requested = requested if requested is not None else model
        self.holds = holds  # may wait for its SLO (a tokenizer lookup never does)

    @property
    def models(self) -> tuple[str, ...]:
        """The models that may serve it, in order of preference."""
        return (self.model, *self.fallbacks)

    def serving(self, model: str) -> RequestInfo:
        """The same request as it is asked of another model (a fallback)."""
        other = RequestInfo(
            self.request_id, model, self.prompt_tokens, self.max_tokens,
            session_id=self.session_id, prefix_blocks=self.prefix_blocks,
            priority=self.priority, deadline=self.deadline, tenant=self.tenant, slo=self.slo,
            arrived_at=self.arrived_at, requested=self.requested, adapter=self.adapter,
            holds=self.holds,
        )  # fmt: skip
        other.client_request_id = self.client_request_id
        return other

    def __repr__(self) -> str:
        return (
            f"RequestInfo({self.request_id!r}, model={self.model!r}, "
            f"prompt={self.prompt_tokens}, max_tokens={self.max_tokens})"
        )
