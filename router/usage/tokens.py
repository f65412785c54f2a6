"""Token-level truth: what each request used, as its engine counted it, read once at the
end of the request and counted in `gpuroute_tokens_total{model,tenant,direction}` (tenants
and models bounded as every label is, router/config/metrics.py, so the series stay few).

Streams ask the engine for their usage. On the completions family a stream's usage comes
only when asked (`stream_options.include_usage`), as one last chunk with no choices. The
router asks for it on every such stream, so that token counters, quotas and usage records
read what the engine counted; where the client did not ask, that chunk is read by the tally
and dropped from what the client receives (gpuroute/relay/strip.py `StrippingTally`)."""

from __future__ import annotations

from gpuroute.router.observe.metrics import Children, RouterMetrics

from gpuroute.relay.strip import usage_asked

USAGE_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions"})


def ask_usage(route: str, stream: bool, body: dict | None) -> bool:
    """Whether the usage chunk is to be stripped: a stream on the completions family whose
    client did not ask for usage is sent asking for it (`body`, the one parsed at
    admission, is edited; router/attempts/exchange.py serialises it once)."""
    if not stream or body is None or route not in USAGE_ROUTES:
        return False
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        return False  # the engine answers it as the client wrote it
    if usage_asked(body):
        return False  # asked for: relayed as it comes
    body["stream_options"] = {**(options or {}), "include_usage": True}
    return True


class TokenCounter:
    """Counts into `gpuroute_tokens_total` (router/observe/metrics.py)."""

    def __init__(self, metrics: RouterMetrics) -> None:
        self.tenant_label, self.model_label = metrics.tenant_label, metrics.model_label
        self.tokens_by = Children(metrics.tokens, metrics.deferrals)

    def count(self, model: str, tenant: str, prompt: int, completion: int) -> None:
        model, label = self.model_label(model), self.tenant_label(tenant)
        if prompt:
            self.tokens_by(model, label, "prompt").inc(prompt)
        if completion:
            self.tokens_by(model, label, "completion").inc(completion)
