"""Starting points for the router's cost model, from the engine model's roofline.

The router learns output lengths online; per-GPU-type token costs start here, so the very
first decisions already know an H100 from an L4. Units are GPU-seconds of the real GPU; a
fleet that runs uniformly slower (the fake engine's time scale) keeps the same ratios."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextlib import suppress
from dataclasses import dataclass

from gpuroute.router.core.cost import GpuCostPrior
from gpuroute.router.core.latency_prior import LatencyPrior

from gpuroute.gpus import GPU_SPECS, GpuSpec
from gpuroute.models import DEFAULT_MODEL, MODELS, ModelSpec
from gpuroute.roofline import EngineKind, EngineParams

REFERENCE_PROMPT = 1000
REFERENCE_OUTPUT = 250
REFERENCE_GPU = "H100"  # capacities are relative to it


@dataclass(frozen=True, slots=True)
class GpuPriors:
    cost: GpuCostPrior
    # reference requests/s relative to an H100 (1.0; what `backends[].capacity` is in); a
    # newer, faster type is above 1
    capacity: float
    unloaded_tpot_s: float  # one sequence alone: the floor of time per output token
    latency: LatencyPrior  # what the latency model predicts TTFT and TPOT from


def kind_priors(params: EngineParams) -> tuple[GpuCostPrior, float, LatencyPrior]:
    """One engine kind's cost rates, unloaded TPOT and latency prior, at the reference request."""
    prefill = params.prefill_s(REFERENCE_PROMPT) / REFERENCE_PROMPT
    decode = params.decode_token_cost_s(REFERENCE_PROMPT, REFERENCE_OUTPUT)
    tpot = params.step_s(1, REFERENCE_PROMPT + REFERENCE_OUTPUT / 2)
    return GpuCostPrior(prefill, decode), tpot, LatencyPrior.from_engine(params)


class PriorBook:
    """Priors per engine kind (GPU type × parallel degree × model shape), computed when a
    kind first appears. Capacities are in one unit across kinds: reference requests/s of
    one H100 running the default shape, so a TP4 70B and an 8B compare on the same scale."""

    def __init__(
        self,
        gpus: Mapping[str, GpuSpec] | None = None,
        shapes: Mapping[str, ModelSpec] | None = None,
        default_model: str = DEFAULT_MODEL,
    ) -> None:
        self.gpus = gpus if gpus is not None else GPU_SPECS
        # served model names and shape names, each to the shape it runs
        self.shapes = dict(MODELS) | dict(shapes or {})
        for spec in list(self.shapes.values()):
            self.shapes.setdefault(spec.name, spec)
        self.default_model = default_model
        self.table: dict[str, GpuPriors] = {}
        # told of each kind added after construction (the scheduler's and watch's tables)
        self.listeners: list[Callable[[str, GpuPriors], None]] = []
        reference = EngineKind(REFERENCE_GPU, default_model)
        if REFERENCE_GPU not in self.gpus or not self._fits(reference):
            reference = EngineKind(next(iter(self.gpus)), default_model)
        cost, _, _ = kind_priors(self.params(reference))
        self.reference_s = cost.seconds(REFERENCE_PROMPT, REFERENCE_OUTPUT)
        for gpu in self.gpus:  # every type for the default shape, as a one-GPU engine
            with suppress(ValueError):  # one the shape does not fit on has no priors
                self.ensure(EngineKind(gpu, default_model))

    def params(self, kind: EngineKind) -> EngineParams:
        return EngineParams(self.gpus[kind.gpu], self.shapes[kind.model], tp=kind.tp, pp=kind.pp)

    def _fits(self, kind: EngineKind) -> bool:
        try:
            self.params(kind)
        except ValueError:
            return False
        return True

    def ensure(self, kind: EngineKind) -> str:
        """The kind's key, its priors computed if new; ValueError if the model does not fit
        (or the GPU type or shape is unknown), saying which."""
        key = kind.key(self.default_model)
        if key in self.table:
            return key
        if kind.gpu not in self.gpus:
            raise ValueError(f"unknown GPU type {kind.gpu!r}")
        if kind.model not in self.shapes:
            raise ValueError(f"unknown model shape {kind.model!r}")
        cost, tpot, latency = kind_priors(self.params(kind))  # ValueError: does not fit
        capacity = self.reference_s / cost.seconds(REFERENCE_PROMPT, REFERENCE_OUTPUT)
        self.table[key] = priors = GpuPriors(cost, capacity, tpot, latency)
        for listener in self.listeners:
            listener(key, priors)
        return key

    def shape_of(self, models: Iterable[str]) -> str:
        """The shape an engine serving `models` runs: the first with a known shape, else the
        default (an adapter or an alias named like no shape)."""
        served = next((m for m in models if m in self.shapes), self.default_model)
        return self.shapes[served].name


def engine_priors(model_shape: str = DEFAULT_MODEL) -> dict[str, GpuPriors]:
    """Every built-in GPU type's priors for one model shape on one GPU."""
    return PriorBook(default_model=model_shape).table
