"""Secrets in config in three forms, at most one per secret: inline (`token = "..."`), a file
(`token_file = "/run/secrets/consul-token"`, one line, trailing newline ignored) or an
environment variable named in config (`token_env = "GPUROUTE_CONSUL_TOKEN"`).

Files and variables are read when the process starts, not when a config is checked, so
`gpuroute check-config` can validate a host's config on another machine."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import model_validator

from gpuroute.config import ConfigError

FORMS = ("", "_file", "_env")


def check_forms(section: Any, names: tuple[str, ...]) -> None:
    """A config validator: each secret set in at most one form."""
    for name in names:
        given = [name + form for form in FORMS if getattr(section, name + form) is not None]
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)}: set only one form of the secret {name}")


def read_secret(section: Any, name: str, where: str) -> str | None:
    """The secret's value, from whichever form is set (None: none is); ConfigError naming
    `where.name_file` or `where.name_env` when that form cannot be read."""
    inline = getattr(section, name)
    if inline is not None:
        return inline
    if (path := getattr(section, name + "_file")) is not None:
        return read_secret_file(path, f"{where}.{name}_file")
    if (variable := getattr(section, name + "_env")) is not None:
        value = os.environ.get(variable)
        if not value:
            raise ConfigError(f"{where}.{name}_env: environment variable {variable} is not set")
        return value
    return None


def read_secret_file(path: str, what: str) -> str:
    """A secret's one line (trailing newline ignored); ConfigError naming `what` when the
    file cannot be read or is empty."""
    try:
        value = Path(path).read_text().rstrip("\r\n")
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {path}: {exc.strerror}") from None
    if not value:
        raise ConfigError(f"{what}: {path} is empty")
    return value


def secret_forms(*names: str) -> Any:
    """A model validator for a config section holding these secrets."""

    def check(section: Any) -> Any:
        check_forms(section, names)
        return section

    return model_validator(mode="after")(check)
