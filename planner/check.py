"""`gpuroute plan`'s first question, answered from the roofline before any simulation: which
GPU types can serve each model at all, and which SLO classes are out of reach on them.

A type cannot serve a model whose weights leave no KV cache on it. An SLO class is out of
reach on a type when a request alone on an idle engine already misses it: the prompt at the
attainment quantile (so more than 1 − target of the class's requests are longer) takes
longer to prefill than the class's TTFT bound, or one decode step of a batch of one takes
longer than its TPOT bound. Load only makes both worse, so no count of such GPUs helps."""

from __future__ import annotations

from dataclasses import dataclass

from gpuroute.router.core.latency_prior import LatencyPrior
from gpuroute.router.core.slo import SloClass
from gpuroute.sim.scenario import Scenario
from gpuroute.sim.workloads import Workload

from gpuroute.config import ConfigError
from gpuroute.roofline import DEFAULT_MEMORY_UTILIZATION, EngineParams, usable_bytes
from gpuroute.stats import quantile


class PlanError(ConfigError):
    """No fleet of the given GPU types can meet the SLO: the message says why."""


@dataclass(frozen=True, slots=True)
class GpuOption:
    """A candidate backend: one engine of `tp` GPUs of one type, at its price per hour."""

    gpu: str
    tp: int
    price_per_hour: float  # of the whole engine (tp GPUs)
    tp_given: bool = True  # `H200:tp4`; a bare `H200` takes the least TP a model starts on

    @property
    def label(self) -> str:
        return self.gpu + (f"-tp{self.tp}" if self.tp > 1 else "")


def parse_gpu_options(specs: list[str], scenario: Scenario) -> list[GpuOption]:
    """`H100`, `H200:tp4`: each a GPU type of the scenario's catalog (built-in or
    [[gpu_types]]) with a price; errors name the option."""
    catalog = scenario.gpu_catalog()
    options = []
    for spec in specs:
        name, _, tp_text = spec.partition(":")
        try:
            catalog.check(name)
        except ValueError as exc:
            raise ConfigError(f"--gpu {spec}: {exc}") from None
        tp, given = 1, bool(tp_text)
        if tp_text:
            if not (tp_text.startswith("tp") and tp_text[2:].isdigit() and int(tp_text[2:]) >= 1):
                raise ConfigError(f"--gpu {spec}: write TYPE or TYPE:tpN (e.g. H100:tp4)")
            tp = int(tp_text[2:])
        price = catalog[name].price_per_hour
        if price is None:
            raise ConfigError(f"--gpu {spec}: no price; set price_per_hour in its [[gpu_types]]")
        options.append(GpuOption(name, tp, price * tp, given))
    if len({o.label for o in options}) != len(options):
        raise ConfigError("--gpu: each type once")
    return options


def engine_params(scenario: Scenario, option: GpuOption, model: str) -> EngineParams:
    """The roofline engine; ValueError when the model does not fit (the message says so)."""
    return EngineParams(
        scenario.gpu_catalog()[option.gpu],
        scenario.shapes()[model],
        tp=option.tp,
        chunked_prefill=scenario.chunked_prefill,
        name=option.label,
    )


def cannot_start(params: EngineParams, workload: Workload) -> str | None:
    """Why a real engine of these GPUs could not serve the workload's longest request, or
    None: vLLM starts only when the weights and the KV cache of one whole sequence fit in
    its share of the GPUs' memory (check-config's rule for a fleet file's pools)."""
    longest = int((workload.prompts + workload.outputs).max())
    if params.kv_capacity_tokens >= longest:  # at vLLM's default memory share
        return None
    model = params.model
    usable = usable_bytes(params.gpu, params.tp * params.pp)
    needed = model.weight_total_bytes + model.kv_bytes_per_token * longest
    return (
        f"model {model.name} on {params.name}: weights and the KV cache of the longest "
        f"request ({longest:,} tokens) take {needed / 1e9:.1f} GB, more than the "
        f"{usable / 1e9:.1f} GB an engine may use ({DEFAULT_MEMORY_UTILIZATION:g} of the "
        "GPUs' memory): it could not start; give the type more GPUs per engine (TYPE:tpN)"
    )


def unreachable(
    params: EngineParams, slo: SloClass, workload: Workload, attainment: float
) -> str | None:
    """Why `slo` cannot be met on this engine even idle, or None when it can."""
    prior = LatencyPrior.from_engine(params)
    prompt = quantile(workload.prompts, attainment)
    step = prior.decode_step_s(1, prompt)
    ttft, _ = prior.prefill_s(prompt, step)
    if ttft > slo.ttft_s:
        return (
            f"TTFT bound {slo.ttft_s:g} s is below one {prompt:,.0f}-token prefill "
            f"({ttft:.3g} s, the prompt at the {attainment:.0%} quantile) on an idle engine"
        )
    if step > slo.tpot_s:
        return (
            f"TPOT bound {slo.tpot_s:g} s is below one decode step alone ({step:.3g} s, "
            f"reading {params.model.weight_total_bytes / 1e9:.0f} GB of weights)"
        )
    return None


def usable_options(
    scenario: Scenario, options: list[GpuOption], model: str, workload: Workload, target: float
) -> tuple[list[GpuOption], list[str]]:
    """The options that can serve `model` and every SLO class reachable anywhere, and the
    reasons each other one was left out. Raises PlanError when none can."""
    classes, shares = scenario.classes_of(model)
    options, widened = _widened(scenario, options, model, workload)
    reasons: dict[str, list[str]] = {}  # what the answer says, per GPU type left out
    no_fit: set[str] = set()
    misses: dict[str, set[str]] = {}  # the SLO classes each type cannot reach
    for option in options:
        try:
            params = engine_params(scenario, option, model)
            short = cannot_start(params, workload)
            if short is not None:
                raise ValueError(short)
        except ValueError as exc:
            no_fit.add(option.label)
            reasons[option.label] = [str(exc)]
            continue
        for slo in classes:
            why = unreachable(params, slo, workload, target)
            if why is not None:
                misses.setdefault(option.label, set()).add(slo.name)
                reasons.setdefault(option.label, []).append(f"SLO class {slo.name!r}: {why}")
    fit = [o for o in options if o.label not in no_fit]
    lost = [
        (slo, share)
        for slo, share in zip(classes, shares, strict=True)
        if fit and all(slo.name in misses.get(o.label, ()) for o in fit)
    ]
    if not fit or sum(share for _, share in lost) > 1 - target + 1e-9:
        detail = "; ".join(f"{label}: {', '.join(why)}" for label, why in reasons.items())
        raise PlanError(
            f"no fleet of {', '.join(o.label for o in options)} can serve model {model!r} "
            f"at {target:.0%} attainment: {detail}"
        )
    lost_names = {slo.name for slo, _ in lost}
    usable = [o for o in fit if misses.get(o.label, set()) <= lost_names]
    if not usable:  # every fitting type misses some class the others reach
        usable = fit
    kept = {o.label for o in usable}
    notes = widened + [
        f"{label} left out for {model}: {'; '.join(why)}"
        for label, why in reasons.items()
        if label not in kept
    ]
    return usable, notes


WIDER_TP = (2, 4, 8)  # what a bare GPU type grows to when one GPU cannot start the model


def _widened(
    scenario: Scenario, options: list[GpuOption], model: str, workload: Workload
) -> tuple[list[GpuOption], list[str]]:
    """Each bare `TYPE` option at the least tensor parallelism whose engine can start
    `model` (a 70B on one 80 GB GPU cannot: it becomes TYPE-tp2), and a note for each."""
    out, notes = [], []
    labels = {o.label for o in options}
    for option in options:
        if option.tp_given or _starts(scenario, option, model, workload):
            out.append(option)
            continue
        per_gpu = option.price_per_hour / option.tp
        wider = (GpuOption(option.gpu, tp, per_gpu * tp, False) for tp in WIDER_TP)
        chosen = next((w for w in wider if _starts(scenario, w, model, workload)), None)
        if chosen is None or chosen.label in labels:
            out.append(option)  # said as left out, or given already
            continue
        out.append(chosen)
        notes.append(
            f"{option.label} cannot start {model} on one GPU: planned as {chosen.label} "
            f"(say {option.gpu}:tpN to choose)"
        )
    return out, notes


def _starts(scenario: Scenario, option: GpuOption, model: str, workload: Workload) -> bool:
    try:
        return cannot_start(engine_params(scenario, option, model), workload) is None
    except ValueError:
        return False
