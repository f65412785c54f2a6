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
        "deadline",
        "max_tokens",
        "model",
        "prefix_blocks",
        "priority",
        "prompt_tokens",
        "request_id",
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
        adapter: str | None = None,
    ) -> None:
        self.adapter = adapter  # the LoRA adapter it names (its `model` there), else None
        self.slo = slo  # the class it should meet; None: the scheduler's default
        self.arrived_at = arrived_at  # when its TTFT clock started (None: at routing)
        self.tenant = tenant  # set from the API key; fair queuing is per tenant
        self.request_id = request_id
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.session_id = session_id
        self.prefix_blocks = prefix_blocks
        self.priority = priority
        self.deadline = deadline

    def __repr__(self) -> str:
        return (
            f"RequestInfo({self.request_id!r}, model={self.model!r}, "
            f"prompt={self.prompt_tokens}, max_tokens={self.max_tokens})"
        )
