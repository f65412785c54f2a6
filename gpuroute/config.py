"""TOML configuration loaded into pydantic models, with errors that name the file and the key."""

from __future__ import annotations

import ipaddress
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

ModelT = TypeVar("ModelT", bound=BaseModel)


class ConfigError(ValueError):
    """A configuration file that cannot be used; the message names the file and the key."""


class StrictModel(BaseModel):
    """Base for config sections: unknown keys are typos, so they are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def known_name(value: str, known: Iterable[str], what: str) -> str:
    """Validate a name against a vocabulary; the error lists what is allowed."""
    known = tuple(known)
    if value not in known:
        raise ValueError(f"unknown {what} {value!r}; known: {', '.join(known)}")
    return value


def http_url(value: str, *, need_port: bool = False) -> str:
    """An http(s)://host[:port] URL without a trailing slash."""
    parts = urlsplit(value)
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or (need_port and not parts.port)
    ):
        raise ValueError(f"expected an http(s)://host:port URL, got {value!r}")
    return value.rstrip("/")


HttpUrl = Annotated[str, AfterValidator(http_url)]
HttpUrlWithPort = Annotated[str, AfterValidator(lambda v: http_url(v, need_port=True))]


# Sections every listening tier (router, global) shares.
class TlsConfig(StrictModel):
    """A listener's certificate; with `client_ca_file`, clients must present a certificate
    that CA signed (mutual TLS), and a handshake without one is refused."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None


class ListenConfig(StrictModel):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    tls: TlsConfig | None = None

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    def url(self, port: int | None = None) -> str:
        """The listener's URL (`port`: the one bound, where the config says 0)."""
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 literal
        return f"{self.scheme}://{host}:{self.port if port is None else port}"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class LimitsConfig(StrictModel):
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    connect_timeout_s: float = Field(default=2.0, gt=0)
    first_byte_timeout_s: float = Field(default=120.0, gt=0)  # prefill + queueing upstream
    idle_timeout_s: float = Field(default=60.0, gt=0)  # between two chunks of a stream
    # A client connection must deliver a complete request head this soon after it opens
    # or after its last response; idle keep-alive connections close after it too.
    header_timeout_s: float = Field(default=15.0, gt=0)
    body_timeout_s: float = Field(default=30.0, gt=0)  # to read a whole request body (408)
    # a client this far behind (one write waiting this long) is cut off, its engine request
    # aborted: a reader that stops must not hold a backend's slot
    client_write_timeout_s: float = Field(default=10.0, gt=0)
    max_connections_per_ip: int = Field(default=256, ge=1)  # open client connections


def key_path(loc: tuple[int | str, ...]) -> str:
    """Render a pydantic error location as a TOML-ish key: `regions[0].gpu_pools[1].gpu`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


# pydantic's wording for a few errors, said as a config file's reader thinks of them
_BOUNDS = {
    "greater_than": ">",
    "greater_than_equal": ">=",
    "less_than": "<",
    "less_than_equal": "<=",
}
_PLAIN = {"extra_forbidden": "unknown key", "missing": "missing (required)"}


def short_message(item: Mapping[str, Any]) -> str:
    """A pydantic error in a few words (`must be > 0`, `unknown key`): users read these
    against their TOML, not against our models."""
    kind, ctx = item["type"], item.get("ctx") or {}
    if kind in _PLAIN:
        return _PLAIN[kind]
    if kind in _BOUNDS and len(ctx) == 1:
        bound = next(iter(ctx.values()))
        if isinstance(bound, float) and bound.is_integer():
            bound = int(bound)  # `> 0`, not `> 0.0`
        return f"must be {_BOUNDS[kind]} {bound}"
    return str(item["msg"]).removeprefix("Value error, ")


# a message that starts with the key it is about (`models[0].aliases[1]: ...`)
KEYED = re.compile(r"^[A-Za-z_][\w.\[\]]*: ")


def describe_validation_error(path: Path | str, err: ValidationError) -> str:
    """One line per problem: `file: key: message`."""
    lines = []
    for item in err.errors(include_url=False):
        loc = tuple(
            p for p in item["loc"] if not (isinstance(p, str) and p.startswith("function-"))
        )
        message = short_message(item)
        if not loc and KEYED.match(message):  # a check across keys names its own key
            lines.append(f"{path}: {message}")
        else:
            lines.append(f"{path}: {key_path(loc)}: {message}")
    return "\n".join(lines)


def read_toml(path: Path | str) -> dict[str, Any]:
    """Parse a TOML file, turning I/O and syntax errors into ConfigError."""
    path = Path(path)
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None


def validate(path: Path | str, data: dict[str, Any], model: type[ModelT]) -> ModelT:
    """Validate parsed data against a model; errors name `path` and the offending key. Paths
    in the file are relative to its directory (`config_dir` in the validation context); a
    model with a `validation_context(data)` classmethod adds to the context (the file's
    declared GPU types)."""
    context: dict[str, Any] = {"config_dir": Path(path).parent}
    extra = getattr(model, "validation_context", None)
    if extra is not None:
        context |= extra(data)
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(path, exc)) from None


def load_toml_model(path: Path | str, model: type[ModelT]) -> ModelT:
    """Read and validate a TOML file in one step."""
    return validate(path, read_toml(path), model)
