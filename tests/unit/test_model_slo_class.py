"""A model's own SLO class: its requests get it unless the key names one, and the
`x-gpuroute-slo` header may still ask for a laxer class, never a stricter one."""

from __future__ import annotations

from gpuroute.router.config.router import SloConfig
from gpuroute.router.front.slo import SloGate
from gpuroute.router.observe.metrics import RouterMetrics
from gpuroute.router.shared.quotas import KeyPolicy


def gate() -> SloGate:
    return SloGate(SloConfig(), RouterMetrics(), lambda: 0.0)


def test_the_models_class_applies_when_the_key_names_none() -> None:
    anonymous, interactive_key = KeyPolicy("t"), KeyPolicy("t", slo_class="interactive")
    g = gate()
    assert g.resolve(anonymous, {}).name == "standard"  # the default class
    assert g.resolve(anonymous, {}, "batch").name == "batch"
    assert g.resolve(interactive_key, {}, "batch").name == "interactive"  # the key's first
    # the header may relax the model's class, not tighten it
    assert g.resolve(anonymous, {"x-gpuroute-slo": "interactive"}, "batch").name == "batch"
    assert g.resolve(anonymous, {"x-gpuroute-slo": "batch"}, "standard").name == "batch"
