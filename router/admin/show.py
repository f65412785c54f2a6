"""The admin API's answers as `gpuroute admin` prints them for an operator: a line, or a
table with a row per backend or key. Only what the API returned is shown (it holds no
secret: keys are their sha256, the config comes redacted)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

BACKEND_COLUMNS = ("id", "gpu", "state", "in_flight", "url", "models", "reason")
KEY_COLUMNS = ("sha256", "tenant", "source", "limits")


def as_json(answer: Any) -> str:
    return json.dumps(answer, indent=2, ensure_ascii=False)


def table(rows: Sequence[dict], columns: Sequence[str]) -> str:
    """Aligned columns under an upper-case header; a list cell joined by commas."""
    cells = [[c.upper() for c in columns]] + [[_cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = ("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells)
    return "\n".join(line.rstrip() for line in lines)


def _cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


def reloaded(answer: dict) -> str:
    backends = ", ".join(answer["backends"]) or "none"
    return f"reloaded {answer['reloaded']}: policy {answer['policy']}, static backends: {backends}"


def backends(answer: dict) -> str:
    lines = [f"policy: {answer['policy']}", table(answer["backends"], BACKEND_COLUMNS)]
    if (m := answer.get("membership")) is not None:
        stale = ", stale" if m["stale"] else ""
        lines.append(f"membership: Consul {m['consul']}, {m['members']} members{stale}")
    return "\n".join(lines)


def backend_added(answer: dict) -> str:
    return f"added backend {answer['added']} (it joins warming)"


def drained(answer: dict) -> str:
    then = ", dropped once idle" if answer["state"] == "removing" else ""
    return f"{answer['id']}: {answer['state']}, {answer['in_flight']} in flight{then}"


def keys(answer: dict) -> str:
    in_force = [{**row, "limits": _limits(row)} for row in answer["keys"] if not row.get("revoked")]
    lines = [table(in_force, KEY_COLUMNS)]
    for row in answer["keys"]:
        if row.get("revoked"):
            listed = " (the file still lists it)" if row["in_file"] else ""
            lines.append(f"revoked {row['sha256']}{listed}")
    where = "shared through Redis" if answer["shared"] else "this router's own (no Redis)"
    lines.append(f"added and revoked keys: {where}")
    return "\n".join(lines)


def _limits(row: dict) -> str:
    return " ".join(f"{k}={_cell(v)}" for k, v in row.items() if k not in KEY_COLUMNS)


def key_added(answer: dict) -> str:
    return f"added key {answer['added']} for tenant {answer['tenant']}"


def key_revoked(answer: dict) -> str:
    known = "" if answer["was_in_force"] else " (it was not in force here)"
    return f"revoked key {answer['revoked']}{known}"


def _weights(split: dict[str, float]) -> str:
    return ", ".join(f"{version} {weight:g}%" for version, weight in split.items())


def splits(answer: dict) -> str:
    lines = []
    for name, model in answer["models"].items():
        line = f"{name}: {_weights(model['split']) or 'no split'}"
        if model["fallback"]:
            line += f"; fallback {', '.join(model['fallback'])}"
        lines.append(line)
    lines += [f"{alias} -> {name}" for alias, name in answer["aliases"].items()]
    return "\n".join(lines) or "no [[models]] names"


def split_set(answer: dict) -> str:
    return f"{answer['model']}: {_weights(answer['split'])}"
