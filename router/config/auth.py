"""Who may call a router, and how much: API keys (stored as hashes), the anonymous tenant."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from gpuroute.router.config.body_fields import known_fields
from pydantic import AfterValidator, Field, field_validator

from gpuroute.config import StrictModel

# the models a key may use (LiteLLM's `models` on a virtual key): names or aliases, each
# standing for its model, its split's versions; fallbacks outside it are skipped. Unset:
# every model. Empty is refused: LiteLLM reads [] as every model, a reader as none.
ModelList = Annotated[list[str] | None, Field(default=None, min_length=1)]
# router-only body fields (router/config/body_fields.py) the key may send all the same
BodyFields = Annotated[list[str], AfterValidator(known_fields)]


class ApiKeyConfig(StrictModel):
    sha256: str  # of the key itself: keys are never stored
    tenant: str
    priority: str | None = None  # the key's class: its default and the most it may ask for
    requests_per_minute: float | None = Field(default=None, gt=0)
    tokens_per_minute: float | None = Field(default=None, gt=0)
    # regions or jurisdictions this key's requests may be served in (unset: anywhere); a
    # router elsewhere refuses them with 403, whatever sent them there
    residency: list[str] | None = Field(default=None, min_length=1)
    max_in_flight: int | None = Field(default=None, ge=1)  # the tenant's requests at once
    # the key's SLO class: its default and the most demanding it may ask for by header
    slo_class: str | None = None
    models: ModelList = None
    allow_body_fields: BodyFields = Field(default_factory=list)

    @field_validator("sha256")
    @classmethod
    def _digest(cls, value: str) -> str:
        if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
            raise ValueError("expected a lowercase sha256 hex digest of the key")
        return value


class AnonymousConfig(StrictModel):
    """The quota every keyless caller shares (when keyless calls are allowed at all)."""

    priority: str | None = None  # their class (at most); unset: admission.default_priority
    requests_per_minute: float | None = Field(default=None, gt=0)
    tokens_per_minute: float | None = Field(default=None, gt=0)
    max_in_flight: int | None = Field(default=None, ge=1)
    slo_class: str | None = None
    models: ModelList = None
    allow_body_fields: BodyFields = Field(default_factory=list)


def key_problem(
    key: ApiKeyConfig | AnonymousConfig,
    priorities: Sequence[str],
    slo_classes: Sequence[str],
    placed: bool,
) -> tuple[str, str] | None:
    """What makes a key unusable on this router, as (field, why), or None: the file's keys
    and the admin API's are checked by this one function (a key the admin API took with an
    unknown class answered every request with a 500)."""
    if key.priority is not None and key.priority not in priorities:
        why = f"unknown priority {key.priority!r}; known: {', '.join(priorities)}"
        return "priority", why
    if key.slo_class is not None and key.slo_class not in slo_classes:
        why = f"unknown SLO class {key.slo_class!r}; known: {', '.join(slo_classes)}"
        return "slo_class", why
    if getattr(key, "residency", None) is not None and not placed:
        why = "set region.name or region.jurisdiction, or the router cannot tell whether "
        return "residency", why + "it may serve this key"
    return None


class AuthConfig(StrictModel):
    # true: every request needs a known key. With keys listed, keys are required unless
    # allow_anonymous is set; keyless callers then share the `anonymous` tenant's quota.
    required: bool = False
    allow_anonymous: bool = False
    anonymous: AnonymousConfig = AnonymousConfig()
    keys: list[ApiKeyConfig] = Field(default_factory=list)
    # what a request without max_tokens is charged per answer at admission (at most the
    # key's tokens_per_minute); the engine's reported usage settles it at the end
    default_max_tokens: int = Field(default=1024, ge=1)
    # how often a replica checks Redis for keys added or revoked through the admin API:
    # the bound on how long a revoked key still works on another replica
    key_sync_s: float = Field(default=0.25, gt=0, le=60)

    @property
    def keys_required(self) -> bool:
        return self.required or (bool(self.keys) and not self.allow_anonymous)
