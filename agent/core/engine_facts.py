"""What an engine serves and how it spans GPUs, as the agent advertises it (pure: the shell
in agent/engine_info.py does the HTTP).

The engine is asked first, the config second: `/v1/models` says which models and adapters
it serves and their context length; where the engine exposes its parallel layout (vLLM's
dev-mode `/server_info`, SGLang's `/server_info`) that is the degree. Whatever the config
says and the engine contradicts is logged with both sides, and the engine's word is what
routers hear: it is what actually runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

META_VALUE_MAX = 512  # Consul's limit on one Meta value

# where an engine kind says how it is parallelised: paths to try, in order
PARALLEL_PATHS: dict[str, tuple[str, ...]] = {
    # only with VLLM_SERVER_DEV_MODE=1; its /metrics carries no parallel layout
    "vllm": ("/server_info?config_format=json",),
    "sglang": ("/server_info", "/get_server_info"),  # the second before SGLang 0.5
}


@dataclass(frozen=True, slots=True)
class Parallelism:
    """One engine instance: `tp` GPUs per pipeline stage, `pp` stages, `dp` data-parallel
    replicas behind the same endpoint."""

    tp: int = 1
    pp: int = 1
    dp: int = 1

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    def __str__(self) -> str:
        return f"tensor_parallel={self.tp} pipeline_parallel={self.pp} data_parallel={self.dp}"


@dataclass(frozen=True, slots=True)
class ServedModel:
    """One entry of `/v1/models`: a base model, or a LoRA adapter (`parent` = its base)."""

    id: str
    parent: str | None = None
    max_model_len: int | None = None

    @property
    def adapter(self) -> bool:
        return self.parent is not None and self.parent != self.id


@dataclass(frozen=True, slots=True)
class EngineFacts:
    """What the agent writes into Consul Meta about its engine."""

    models: tuple[str, ...]
    parallel: Parallelism
    max_model_len: int | None = None
    adapters: tuple[str, ...] = ()  # the models above that are LoRA adapters
    learned: bool = False  # models came from the engine, not only the config


def parse_models(body: Any) -> list[ServedModel]:
    """The entries of an OpenAI `/v1/models` answer (`{"data": [{"id": ...}, ...]}`); entries
    without a string id are skipped. ValueError when the shape is not a model list."""
    data = body.get("data") if isinstance(body, Mapping) else None
    if not isinstance(data, list):
        raise ValueError("not an OpenAI model list (no 'data' array)")
    out: list[ServedModel] = []
    for item in data:
        if not isinstance(item, Mapping) or not isinstance(item.get("id"), str) or not item["id"]:
            continue
        parent = item.get("parent")
        length = item.get("max_model_len")
        out.append(
            ServedModel(
                id=item["id"],
                parent=parent if isinstance(parent, str) and parent else None,
                max_model_len=length if _positive_int(length) else None,
            )
        )
    return out


def parse_parallel(kind: str, body: Any) -> Parallelism | None:
    """The degrees an engine reports about itself, or None when the answer has none."""
    if not isinstance(body, Mapping):
        return None
    if kind == "vllm":
        config = body.get("vllm_config")
        section = config.get("parallel_config") if isinstance(config, Mapping) else None
        keys = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
    elif kind == "sglang":
        section, keys = body, ("tp_size", "pp_size", "dp_size")
    else:
        return None
    if not isinstance(section, Mapping) or not _positive_int(section.get(keys[0])):
        return None
    tp, pp, dp = (section.get(k) for k in keys)
    return Parallelism(tp, pp if _positive_int(pp) else 1, dp if _positive_int(dp) else 1)


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def model_problems(configured: Sequence[str] | None, served: Sequence[ServedModel]) -> str | None:
    """Where `[engine] models` and `/v1/models` disagree: a configured name the engine does
    not serve, or a base model it serves that the config leaves out. Adapters the config does
    not list are no problem: engines load them at run time."""
    if configured is None:
        return None
    ids = {m.id for m in served}
    missing = [m for m in configured if m not in ids]
    unlisted = [m.id for m in served if not m.adapter and m.id not in configured]
    if not missing and not unlisted:
        return None
    then = (
        f"the agent registers the engine only once it serves {missing}"
        if missing
        else "advertising what the engine serves"
    )
    return (
        f"engine.models is {list(configured)} but the engine serves "
        f"{[m.id for m in served]} (GET /v1/models); {then}"
    )


def parallel_problem(declared: Parallelism, explicit: bool, reported: Parallelism) -> str | None:
    """The config's degrees against the engine's, when the config set any."""
    if not explicit or declared == reported:
        return None
    return (
        f"[engine] says {declared} ({declared.gpus} GPUs) but the engine reports {reported} "
        f"({reported.gpus} GPUs); advertising what the engine reports"
    )


def fit_models(served: Sequence[ServedModel], limit: int = META_VALUE_MAX) -> tuple[str, ...]:
    """The served names that fit one Meta value: base models first, then adapters in the
    engine's order, each once, while the comma-joined list stays within `limit`."""
    ordered = [m.id for m in served if not m.adapter] + [m.id for m in served if m.adapter]
    out: list[str] = []
    used = -1  # no comma before the first name
    for name in dict.fromkeys(ordered):
        if used + 1 + len(name) > limit:
            continue
        out.append(name)
        used += 1 + len(name)
    return tuple(out)


def facts(
    configured: Sequence[str] | None,
    declared: Parallelism,
    served: Sequence[ServedModel] | None,
    reported: Parallelism | None,
) -> EngineFacts:
    """What to advertise: the engine's answers where it gave them, else the config's."""
    parallel = reported or declared
    if not served:
        return EngineFacts(tuple(configured or ()), parallel)
    lengths = [m.max_model_len for m in served if m.max_model_len is not None]
    models = fit_models(served)
    adapters = tuple(m.id for m in served if m.adapter and m.id in models)
    # the shortest context of the bases: a request that fits it fits every model here
    return EngineFacts(models, parallel, min(lengths, default=None), adapters, learned=True)
