#!/usr/bin/env python3
"""Write an engine's command-line options as the table gpuroute checks a fleet file's engine
arguments against (fleet/engine_flags/<kind>-<version>.json), so that `check-config` needs
no engine installed. Read from the engine's own parser, never typed by hand.

  engine-flags.py vllm [--out FILE]
      Run with the python of the vLLM CPU build (scripts/build-vllm-cpu.sh prints it):
      builds `vllm serve`'s parser as vLLM's CLI does and reads its options.
  engine-flags.py sglang WHEEL [--out FILE]
      Run with the same python, which has the torch and transformers SGLang imports:
      unpacks the wheel (`pip download sglang==V --no-deps`) to a temporary folder,
      imports `sglang.srt.server_args` from it with the few modules neither provides
      (flash_attn, IPython, ...) stubbed, imported by SGLang only, and reads the parser
      `ServerArgs.add_cli_args` builds (that of `python -m sglang.launch_server`).
      Stubs never reach a choice list: a choice that is not plain data stops the script.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import json
import shutil
import sys
import tempfile
import types
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLAIN = (str, int, float, bool, type(None))


def type_name(kind: object) -> str:
    """A name check_engine_args understands for an option's `type=` callable: str, int,
    float (a trailing ? when '' and 'None' mean None too), human_int (vLLM's 1k / 2M),
    human_int_or_auto, json, json_config,
    lower_snake (lower-cased, - to _ before the choice check)."""
    if kind is None or kind is str:
        return "str"
    if kind in (int, float, bool):
        return kind.__name__
    name = getattr(kind, "__name__", "")
    known = {"human_readable_int": "human_int", "human_readable_int_or_auto": "human_int_or_auto"}
    if name in known:
        return known[name]
    if name == "loads":
        return "json"
    if name == "parse_dataclass":  # JSON with 1k-style numbers in it: left to the engine
        return "json_config"
    if name == "union_dict_and_str":
        return "str"
    inner = _closure_type(kind)
    if inner is not None:
        return type_name(inner) + ("?" if name == "_optional_type" else "")
    return _probe_type(kind)


def _closure_type(kind: object) -> object | None:
    """vLLM's optional_type(T) and parse_type(T) wrappers keep T in a closure cell."""
    code = getattr(kind, "__code__", None)
    cells = getattr(kind, "__closure__", None) or ()
    if code is None or "return_type" not in code.co_freevars:
        return None
    return cells[code.co_freevars.index("return_type")].cell_contents


def _probe_type(kind: object) -> str:
    """An unnamed converter (a lambda), told apart by what it does to a sample value."""
    try:
        if kind("Ab-Cd") == "ab_cd":
            return "lower_snake"
    except Exception:
        pass
    return "other"


def option_rows(parser: argparse.ArgumentParser) -> tuple[list[dict], list[dict]]:
    """The parser's options and positionals as plain data, in a stable order."""
    options, positionals = [], []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        choices = None
        if action.choices is not None:
            choices = sorted(action.choices, key=str)
            bad = [c for c in choices if not isinstance(c, PLAIN)]
            if bad or not choices:
                raise SystemExit(f"engine-flags: {action.dest}: choices {choices!r} not plain")
        row = {
            "flags": list(action.option_strings),
            "dest": action.dest,
            "nargs": action.nargs,
            "choices": choices,
            "type": type_name(action.type) if action.nargs != 0 else None,
        }
        (options if action.option_strings else positionals).append(row)
    options.sort(key=lambda row: row["flags"][0])
    return options, positionals


def vllm_table() -> dict:
    """`vllm serve`'s parser, built the way vLLM's CLI main builds it."""
    import vllm
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    top = FlexibleArgumentParser(prog="vllm")
    serve = ServeSubcommand().subparser_init(top.add_subparsers(dest="subparser"))
    options, positionals = option_rows(serve)
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS

    return {
        "engine": "vllm",
        "version": vllm.__version__.split("+")[0],
        "command": "vllm serve",
        "generated_by": "scripts/engine-flags.py vllm",
        # FlexibleArgumentParser: --max_model_len means --max-model-len; --x.key value
        # sets one key of a JSON option x; -O3 is --optimization-level 3
        "syntax": {"underscores": True, "dotted_json": True, "allow_abbrev": serve.allow_abbrev},
        # values the parser takes but the engine refuses before it loads a model
        "engine_choices": {"quantization": sorted(QUANTIZATION_METHODS)},
        "positionals": positionals,
        "options": options,
    }


class _Stub(type):
    """A stand-in class for a name from a missing module: every attribute is another
    stand-in, calling it makes one (or returns a decorated function unchanged)."""

    def __getattr__(cls, name: str) -> object:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Stub(name, (), {})

    def __call__(cls, *args: object, **kwargs: object) -> object:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return _Stub("instance", (), {})

    def __iter__(cls):
        return iter(())

    def __getitem__(cls, key: object) -> object:
        return cls

    def __or__(cls, other: object) -> object:
        return cls

    __ror__ = __or__


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> object:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Stub(name, (), {})


class StubMissing(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Stubs a top-level module that nothing on the path provides, when `owner` (and not
    a library probing for an optional dependency) imports it."""

    def __init__(self, owner: str) -> None:
        self.owner, self.stubbed = owner, set[str]()

    def find_spec(self, name, path, target=None):
        top = name.partition(".")[0]
        if top in self.stubbed:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        if "." in name or top == self.owner or top in sys.stdlib_module_names:
            return None
        if not self._imported_by_owner() or self._found_elsewhere(name, path, target):
            return None
        self.stubbed.add(top)
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def _imported_by_owner(self) -> bool:
        frame = sys._getframe(2)
        while frame is not None:
            module = frame.f_globals.get("__name__", "")
            if module != __name__ and not module.startswith(("importlib", "_frozen")):
                return module.partition(".")[0] == self.owner
            frame = frame.f_back
        return False

    def _found_elsewhere(self, name, path, target) -> bool:
        finders = [f for f in sys.meta_path if f is not self]
        return any(getattr(f, "find_spec", lambda *a: None)(name, path, target) for f in finders)

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module) -> None:
        pass


def sglang_table(wheel: Path) -> dict:
    """`python -m sglang.launch_server`'s parser, from the wheel's own ServerArgs."""
    unpacked = tempfile.mkdtemp(prefix="engine-flags-sglang-")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(unpacked, [n for n in archive.namelist() if n.startswith("sglang/")])
    sys.path.insert(0, unpacked)
    stubs = StubMissing("sglang")
    sys.meta_path.insert(0, stubs)
    from sglang.srt.server_args import ServerArgs
    from sglang.version import __version__

    parser = argparse.ArgumentParser(prog="sglang serve")  # as prepare_server_args builds it
    ServerArgs.add_cli_args(parser)
    options, positionals = option_rows(parser)
    shutil.rmtree(unpacked)
    return {
        "engine": "sglang",
        "version": __version__,
        "command": "python -m sglang.launch_server",
        "generated_by": f"scripts/engine-flags.py sglang {wheel.name}",
        "stubbed_modules": sorted(stubs.stubbed),
        "syntax": {"underscores": False, "dotted_json": False, "allow_abbrev": True},
        "positionals": positionals,
        "options": options,
    }


def dump(table: dict) -> str:
    """JSON with one option a line: a new engine version reads as a short diff."""
    lines = []
    for key, value in table.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            rows = ",\n".join("  " + json.dumps(row) for row in value)
            lines.append(f"{json.dumps(key)}: [\n{rows}\n ]")
        else:
            lines.append(f"{json.dumps(key)}: {json.dumps(value)}")
    return "{\n " + ",\n ".join(lines) + "\n}\n"


def main(argv: list[str]) -> int:
    cli = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    cli.add_argument("kind", choices=["vllm", "sglang"])
    cli.add_argument("wheel", nargs="?", type=Path, help="SGLang's wheel (sglang only)")
    cli.add_argument("--out", type=Path, help="default: fleet/engine_flags/<kind>-<version>.json")
    args = cli.parse_args(argv)
    if args.kind == "sglang" and args.wheel is None:
        cli.error("sglang needs the wheel: pip download sglang==VERSION --no-deps")
    table = vllm_table() if args.kind == "vllm" else sglang_table(args.wheel)
    out = args.out or ROOT / "fleet" / "engine_flags" / f"{args.kind}-{table['version']}.json"
    out.write_text(dump(table))
    print(f"{out}: {len(table['options'])} options of {table['command']} {table['version']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
