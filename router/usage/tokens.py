"""Token-level truth: what each request used, as its engine counted it (the usage it
reports, streams included: router/usage/stream_options.py), read once at the end of the request
and counted in `gpuroute_tokens_total{model,tenant,direction}`. Tenants and models are
bounded as every label is (router/config/metrics.py), so the series stay few."""

from __future__ import annotations

from gpuroute.router.observe.metrics import Children, RouterMetrics


class TokenCounter:
    """Counts into `gpuroute_tokens_total` (router/observe/metrics.py)."""

    def __init__(self, metrics: RouterMetrics) -> None:
        self.tenant_label, self.model_label = metrics.tenant_label, metrics.model_label
        self.tokens_by = Children(metrics.tokens)

    def count(self, model: str, tenant: str, prompt: int, completion: int) -> None:
        model, label = self.model_label(model), self.tenant_label(tenant)
        if prompt:
            self.tokens_by(model, label, "prompt").inc(prompt)
        if completion:
            self.tokens_by(model, label, "completion").inc(completion)
