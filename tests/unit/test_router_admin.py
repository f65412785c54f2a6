"""`GET /admin/backends?prompt_tokens=N&output_tokens=M`: what the latency model predicts
for such a request on each backend, the why behind a lopsided share (issue 31, demo)."""

from __future__ import annotations

import pytest
from gpuroute.router.admin.fleet_view import (
    TypicalRequest,
    describe_backends,
    typical_request,
)
from gpuroute.router.backends.assemble import build_scheduler, prior_book
from gpuroute.router.config.router import RouterConfig


def test_predictions_only_when_asked_with_defaults_for_the_other_size() -> None:
    assert typical_request({}) is None
    assert typical_request({"prompt_tokens": "300"}) == TypicalRequest(300, 128)
    assert typical_request({"output_tokens": "8"}) == TypicalRequest(512, 8)


@pytest.mark.parametrize("bad", ["0", "-1", "lots", "1.5", "", "10000001"])
def test_a_bad_size_names_the_parameter(bad: str) -> None:
    with pytest.raises(ValueError, match=r"^prompt_tokens: expected a whole number"):
        typical_request({"prompt_tokens": bad})


def test_each_backend_gets_the_prediction_for_the_typical_request() -> None:
    config = RouterConfig.model_validate(
        {"backends": [{"id": "h100", "url": "http://127.0.0.1:1", "gpu": "H100", "models": ["m"]},
                      {"id": "l4", "url": "http://127.0.0.1:2", "gpu": "L4", "models": ["m"]}]}
    )  # fmt: skip
    scheduler = build_scheduler(config, prior_book(config))
    plain = describe_backends(scheduler, config, None, 0.0)
    assert "predicted_for" not in plain and "predicted" not in plain["backends"][0]
    body = describe_backends(scheduler, config, None, 0.0, TypicalRequest(1000, 100))
    assert body["predicted_for"] == {
        "prompt_tokens": 1000, "output_tokens": 100,
        "slo_class": "standard", "slo_ttft_s": 2.0, "slo_tpot_s": 0.1,
    }  # fmt: skip
    h100, l4 = (row["predicted"] for row in body["backends"])
    assert 0 < h100["ttft_s"] < l4["ttft_s"] and 0 < h100["tpot_s"] < l4["tpot_s"]
    for p in (h100, l4):
        assert p["e2e_s"] == pytest.approx(p["ttft_s"] + 99 * p["tpot_s"], abs=1e-3)
