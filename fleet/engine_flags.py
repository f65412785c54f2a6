"""A pool's engine arguments checked as the engine's own parser would take them, without the
engine installed: against its options as tables (fleet/engine_flags/<kind>-<version>.json)
that scripts/engine-flags.py reads from vLLM's and SGLang's parsers. An option gpuroute sets
from a fleet-file key is refused in `extra_args`, naming the key: two sources for one
setting would disagree."""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

TABLES = "engine_flags"
ENGINES = {"vllm": "vLLM", "sglang": "SGLang"}
PER_ENGINE = "-"  # set per engine on the host (Terraform), not in the fleet file
# option (its dest) -> the fleet-file key gpuroute renders it from
OWNED = {
    "vllm": {
        "model": "models[0] (its [[models]] `weights`)",
        "model_tag": "models[0] (its [[models]] `weights`)",
        "served_model_name": "models",
        "tensor_parallel_size": "tensor_parallel",
        "pipeline_parallel_size": "pipeline_parallel",
        "data_parallel_size": "count (engines = count / (tensor_parallel x pipeline_parallel))",
        "max_model_len": "engine.max_model_len",
        "quantization": "engine.quantization",
        "gpu_memory_utilization": "engine.gpu_memory_utilization",
        "enable_lora": "engine.lora_modules",
        "lora_modules": "engine.lora_modules",
        "host": PER_ENGINE,
        "port": PER_ENGINE,
        "uds": PER_ENGINE,
    },
    "sglang": {
        "model_path": "models[0] (its [[models]] `weights`)",
        "served_model_name": "models",
        "tp_size": "tensor_parallel",  # the dests of 0.5.23; 0.5.6 names them in full
        "tensor_parallel_size": "tensor_parallel",
        "pp_size": "pipeline_parallel",
        "pipeline_parallel_size": "pipeline_parallel",
        "dp_size": "count (engines = count / (tensor_parallel x pipeline_parallel))",
        "data_parallel_size": "count (engines = count / (tensor_parallel x pipeline_parallel))",
        "context_length": "engine.max_model_len",
        "quantization": "engine.quantization",
        "mem_fraction_static": "engine.gpu_memory_utilization",
        "enable_lora": "engine.lora_modules",
        "lora_paths": "engine.lora_modules",
        "enable_metrics": "+",  # always set: the agent reads the metrics
        "host": PER_ENGINE,
        "port": PER_ENGINE,
    },
}
MAX_SHOWN = 24  # choices listed in a problem
NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")
HUMAN_INT = re.compile(r"^\s*\d+(\.\d+)?([kKmMgGtT]i?)?\s*$")


@dataclass(frozen=True)
class FlagTable:
    """One engine version's options: flag -> its row (flags, dest, nargs, choices, type)."""

    kind: str
    version: str
    command: str
    options: dict[str, dict]
    positionals: tuple[dict, ...]
    syntax: dict[str, bool]
    engine_choices: dict[str, list]

    @property
    def name(self) -> str:
        return f"{ENGINES[self.kind]} {self.version}"


def table_versions(kind: str) -> list[str]:
    """The versions of `kind` that have a table, oldest first."""
    folder = resources.files("gpuroute.fleet") / TABLES
    names = [p.name for p in folder.iterdir() if p.name.startswith(f"{kind}-")]
    versions = [n.removeprefix(f"{kind}-").removesuffix(".json") for n in names]
    return sorted(versions, key=_version_key)


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def nearest_version(version: str, versions: list[str]) -> str:
    """`version` if it has a table; else the newest of its major.minor, else the newest
    older one, else the oldest newer one (no version: the newest)."""
    if version in versions or not versions:
        return version
    key = _version_key(version)
    if not key:
        return versions[-1]
    same = [v for v in versions if _version_key(v)[:2] == key[:2]]
    older = [v for v in versions if _version_key(v) < key]
    return (same or older or versions[:1])[-1]


@cache
def load_table(kind: str, version: str) -> FlagTable:
    text = (resources.files("gpuroute.fleet") / TABLES / f"{kind}-{version}.json").read_text()
    data = json.loads(text)
    options = {flag: row for row in data["options"] for flag in row["flags"]}
    return FlagTable(
        kind,
        data["version"],
        data["command"],
        options,
        tuple(data["positionals"]),
        data["syntax"],
        data.get("engine_choices", {}),
    )


def check_engine_args(kind: str, version: str, argv: list[str], *, rendered: int = 0) -> list[str]:
    """What the engine's parser would refuse in `argv`, each as `key: message`. The first
    `rendered` arguments are gpuroute's own (rendered from the fleet file's keys); the rest
    are the pool's `engine.extra_args`, where options gpuroute sets are refused too. A
    version without a table is checked against the nearest one, and the problems say so."""
    if kind not in ENGINES:
        return [f"engine.kind: unknown engine {kind!r}; one of {', '.join(ENGINES)}"]
    versions = table_versions(kind)
    if not versions:
        return []
    nearest = nearest_version(version, versions)
    table = load_table(kind, nearest)
    problems = _Reader(table, argv, rendered).problems()
    if nearest != version and problems:
        said = f"version {version}" if version else "an image's version"
        note = f" (checked against {table.name}'s options: no table for {said})"
        problems = [p + note for p in problems]
    return problems


class _Reader:
    """Walks an argument list the way argparse does, option by option."""

    def __init__(self, table: FlagTable, argv: list[str], rendered: int) -> None:
        self.table, self.argv, self.rendered = table, argv, rendered
        self.found: list[str] = []
        self.positionals = list(table.positionals)

    def problems(self) -> list[str]:
        i = 0
        while i < len(self.argv):
            token = self.argv[i]
            if _is_option(token):
                i = self._option(i)
            else:
                self._positional(i)
                i += 1
        return self.found

    def where(self, i: int, dest: str | None = None) -> str:
        """The fleet-file key argument i came from."""
        if i >= self.rendered:
            return f"engine.extra_args[{i - self.rendered}]"
        key = OWNED[self.table.kind].get(dest or "", "engine")
        return key.split(" ")[0]

    def _positional(self, i: int) -> None:
        if not self.positionals:
            self.found.append(
                f"{self.where(i)}: {self.argv[i]!r} is not an option of {self.table.name} "
                f"(`{self.table.command}` takes no positional argument here)"
            )
            return
        row = self.positionals.pop(0)
        self._owned(i, row, repr(self.argv[i]))

    def _owned(self, i: int, row: dict, shown: str) -> bool:
        """Refuses, in extra_args, an option gpuroute sets from a key (True when it does)."""
        key = OWNED[self.table.kind].get(row["dest"])
        if i < self.rendered or key is None:
            return False
        if key == PER_ENGINE:
            said = "is set per engine on the host (Terraform's host and port); remove it"
        elif key == "+":
            said = "is set by gpuroute already (the agent reads the metrics); remove it"
        else:
            said = f"is set by gpuroute from the pool's `{key}`; set that instead"
        self.found.append(f"{self.where(i)}: {shown} {said}")
        return True

    def _option(self, i: int) -> int:
        """Reads the option at i and its values; the index after them."""
        token = self.argv[i]
        short_o = re.fullmatch(r"-O=?(\w+)", token)  # vLLM's -O3: --optimization-level 3
        if short_o and self.table.syntax.get("dotted_json"):
            token = f"--optimization-level={short_o.group(1)}"
        name, has_value, value = token.partition("=")
        row, problem = self._lookup(name)
        if row is None:
            self.found.append(f"{self.where(i)}: {problem}")
            return i + 1 + self._skip_values(i + 1, has_value)
        owned = self._owned(i, row, name)
        if problem and not owned:  # one problem an argument
            self.found.append(f"{self.where(i, row['dest'])}: {problem}")
        if "." in name:  # --json-option.key value: one key of a JSON option
            return i + 1 + (0 if has_value else min(1, len(self.argv) - i - 1))
        values = [value] if has_value else self._values(i + 1, row["nargs"])
        spill = i + 1 + len(values) - max(self.rendered, i + 1)
        if i < self.rendered and spill > 0 and not has_value:
            self.found.append(
                f"{self.where(self.rendered)}: {self.argv[self.rendered]!r} would be read as "
                f"a value of {name} (rendered before extra_args); start extra_args with an option"
            )
        if not owned:  # the option itself is the problem, not what it is given
            self._check_count(i, row, name, values, bool(has_value))
            for value in values:
                self._check_value(i, row, name, value)
        return i + 1 + (0 if has_value else len(values))

    def _lookup(self, name: str) -> tuple[dict | None, str]:
        """The option's row (None when unknown) and what is wrong with how it is written."""
        options, syntax = self.table.options, self.table.syntax
        spelled = name
        if syntax.get("underscores") and name.startswith("--"):
            head, dot, tail = name[2:].partition(".")
            spelled = "--" + head.replace("_", "-") + dot + tail
        if syntax.get("dotted_json") and "." in spelled:
            spelled = spelled.partition(".")[0].removesuffix("+")
        if spelled in options:
            return options[spelled], ""
        whole = [f for f in options if f.startswith(spelled) and spelled.startswith("--")]
        if len({options[f]["dest"] for f in whole}) == 1:
            return options[whole[0]], (
                f"write {whole[0]} in full: {name} works only while no other option of "
                f"{self.table.name} starts so"
            )
        close = difflib.get_close_matches(spelled, list(options), n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        return None, f"unknown option {name} of {self.table.name} (`{self.table.command}`){hint}"

    def _values(self, start: int, nargs: int | str | None) -> list[str]:
        """The values argparse would give an option from the arguments after it."""
        limit = {None: 1, "?": 1, "*": len(self.argv), "+": len(self.argv)}.get(nargs, nargs)
        values: list[str] = []
        for token in self.argv[start:]:
            if len(values) >= limit or _is_option(token):
                break
            values.append(token)
        return values

    def _skip_values(self, start: int, has_value: str) -> int:
        """After an unknown option: its likely value, so that it is not read as another."""
        return 0 if has_value else len(self._values(start, None))

    def _check_count(self, i: int, row: dict, name: str, values: list[str], inline: bool) -> None:
        nargs, where = row["nargs"], self.where(i, row["dest"])
        if nargs == 0 and inline:
            self.found.append(f"{where}: {name} takes no value")
        elif nargs in (None, "+") and not values:
            self.found.append(f"{where}: {name} needs a value")
        elif isinstance(nargs, int) and nargs > 0 and len(values) != nargs:
            self.found.append(f"{where}: {name} takes {nargs} values, not {len(values)}")

    def _check_value(self, i: int, row: dict, name: str, value: str) -> None:
        problem = value_problem(row, value, self.table)
        if problem:
            self.found.append(f"{self.where(i, row['dest'])}: {name} {value!r}: {problem}")


def value_problem(row: dict, value: str, table: FlagTable) -> str:
    """What the option's type or choices refuse in `value` ('' when it passes)."""
    kind = row["type"] or "str"
    optional = kind.endswith("?")
    kind = kind.removesuffix("?")
    if optional and value in ("", "None"):
        return ""
    if not _converts(kind, value):
        wanted = {"float": "a number", "json": "JSON"}.get(kind, "an integer")
        return f"not {wanted}"
    choices = row["choices"] or table.engine_choices.get(row["dest"])
    if choices is None or kind not in ("str", "int", "float", "lower_snake"):
        return ""
    given = value.lower().replace("-", "_") if kind == "lower_snake" else value
    if given in {str(c) for c in choices}:
        return ""
    close = difflib.get_close_matches(given, [str(c) for c in choices], n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    shown = ", ".join(map(str, choices[:MAX_SHOWN]))
    more = f", ... {len(choices)} in all" if len(choices) > MAX_SHOWN else ""
    return f"not one of {table.name}'s choices; {hint}({shown}{more})"


def _is_option(token: str) -> bool:
    """As argparse tells an option from a value (a negative number is a value)."""
    return token.startswith("-") and token != "-" and not NEGATIVE_NUMBER.match(token)


def _converts(kind: str, value: str) -> bool:
    try:
        if kind == "int":
            int(value)
        elif kind == "float":
            float(value)
        elif kind == "json":
            json.loads(value)
    except ValueError:
        return False
    if kind == "human_int":
        return bool(HUMAN_INT.match(value))
    if kind == "human_int_or_auto":
        return value.strip().lower() in ("-1", "auto") or bool(HUMAN_INT.match(value))
    return True
