"""A policy with one setting, written as a newcomer would add one: this file and one line
in POLICIES (tests register it with `monkeypatch.setitem`). It reuses the load interface
and a picker plug-in; its setting is read from `[policy_settings.prefer_gpu]`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from gpuroute.router.core.backend import Backend
from gpuroute.router.core.policies.base import PickContext, PolicyBase, check
from gpuroute.router.core.policies.load import connection_share
from gpuroute.router.core.policies.stages import AmongLowest


@dataclass(frozen=True, slots=True)
class PreferGpuSettings:
    gpu: str = "H100"  # the GPU type sent to while one is a candidate

    def __post_init__(self) -> None:
        check(bool(self.gpu), "gpu", "must name a GPU type")


class PreferGpu(PolicyBase):
    """The least loaded backend of one GPU type while one is a candidate, else of all."""

    name: ClassVar[str] = "prefer_gpu"
    Settings: ClassVar[type] = PreferGpuSettings

    def __init__(self, settings: PreferGpuSettings = PreferGpuSettings()) -> None:
        self.gpu = settings.gpu
        self.picker = AmongLowest()

    def pick(self, ctx: PickContext, candidates: Sequence[Backend]) -> Backend:
        preferred = [b for b in candidates if b.gpu == self.gpu] or candidates
        return self.picker.pick(ctx, preferred, [connection_share(ctx, b) for b in preferred])

    def score(self, ctx: PickContext, backend: Backend) -> float | None:
        return connection_share(ctx, backend)
