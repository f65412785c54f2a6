"""The real vLLM's own argument parser, from the cached CPU build (scripts/build-vllm-cpu.sh),
on engine command lines: `vllm serve`'s parser built as vLLM's CLI builds it, then vLLM's
checks of the parsed arguments that run before it loads anything. No server starts."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from support import components

ROOT = Path(__file__).resolve().parents[2]
MARK = "@@gpuroute-parse@@"
PARSE = f"""
import contextlib, io, json, sys
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser

top = FlexibleArgumentParser(prog="vllm")
ServeSubcommand().subparser_init(top.add_subparsers(dest="subparser"))
results = []
for argv in json.load(sys.stdin):
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            validate_parsed_serve_args(top.parse_args(["serve", *argv]))
        results.append(None)
    except SystemExit:  # argparse's error(): usage, then "vllm serve: error: ..."
        lines = said.getvalue().strip().splitlines()
        results.append(lines[-1] if lines else "exit without a message")
    except Exception as exc:
        results.append(f"{{type(exc).__name__}}: {{exc}}")
print({MARK!r} + json.dumps(results))
"""


def parse_with_real_vllm(argvs: list[list[str]]) -> list[str | None]:
    """For each argument list (what follows `vllm serve`): None when vLLM's parser takes it,
    else vLLM's own error. One vLLM import for all (~15-60 s). Skips (fails under
    `make test`) without the cached vLLM."""
    python = components.vllm()
    done = subprocess.run(
        [str(python), "-c", PARSE],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
    if done.returncode != 0 or not lines:
        said = done.stderr[-3000:]
        raise AssertionError(f"vLLM's parser did not run ({done.returncode}): {said}")
    return json.loads(lines[-1].removeprefix(MARK))


def regenerate_vllm_table(out: Path) -> str:
    """scripts/engine-flags.py run by the cached vLLM's python into `out`; its text."""
    python = components.vllm()
    script = ROOT / "scripts" / "engine-flags.py"
    done = subprocess.run(
        [str(python), str(script), "vllm", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"engine-flags.py vllm failed: {done.stderr[-3000:]}")
    return out.read_text()
