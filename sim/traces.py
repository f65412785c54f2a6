"""Trace readers: Azure LLM inference 2023 CSV, Mooncake JSONL, and length-only CSVs.

Each returns a Workload with arrivals starting at 0. Errors name the file and the line."""

from __future__ import annotations

import csv
import json
from datetime import datetime
from pathlib import Path

import numpy as np
from gpuroute.sim.workloads import Workload, poisson_arrivals

TRACE_FORMATS = ("azure", "mooncake", "lengths")


class TraceError(ValueError):
    pass


def _workload(arrivals, prompts, outputs, blocks=None) -> Workload:
    n = len(prompts)
    arr = np.asarray(arrivals, dtype=np.float64)
    if n:
        arr = arr - arr[0]
    return Workload(
        arr,
        np.asarray(prompts, dtype=np.int64),
        np.asarray(outputs, dtype=np.int64),
        blocks if blocks is not None else [()] * n,
        [None] * n,
    )


def read_azure(path: Path) -> Workload:
    """Columns TIMESTAMP (`YYYY-MM-DD HH:MM:SS.fffffff`), ContextTokens, GeneratedTokens."""
    arrivals, prompts, outputs = [], [], []
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} - set(reader.fieldnames or ())
        if missing:
            raise TraceError(f"{path}: not an Azure LLM trace, missing columns {sorted(missing)}")
        for line, row in enumerate(reader, start=2):
            try:
                stamp = row["TIMESTAMP"]
                whole, _, frac = stamp.partition(".")
                t = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").timestamp()
                arrivals.append(t + (float("0." + frac) if frac else 0.0))
                prompts.append(int(row["ContextTokens"]))
                outputs.append(int(row["GeneratedTokens"]))
            except (ValueError, TypeError) as exc:
                raise TraceError(f"{path}:{line}: bad row: {exc}") from None
    order = np.argsort(np.asarray(arrivals), kind="stable")
    return _workload(
        np.asarray(arrivals)[order], np.asarray(prompts)[order], np.asarray(outputs)[order]
    )


def read_mooncake(path: Path) -> Workload:
    """JSON lines with timestamp (ms), input_length, output_length, hash_ids."""
    arrivals, prompts, outputs, blocks = [], [], [], []
    with path.open() as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                arrivals.append(row["timestamp"] / 1000.0)
                prompts.append(int(row["input_length"]))
                outputs.append(int(row["output_length"]))
                blocks.append(tuple(int(h) for h in row.get("hash_ids", ())))
            except (ValueError, KeyError, TypeError) as exc:
                raise TraceError(f"{path}:{line_no}: bad record: {exc!r}") from None
    return _workload(arrivals, prompts, outputs, blocks)


def read_lengths(path: Path, seed: int, rate: float = 1.0) -> Workload:
    """Rows of num_prefill_tokens, num_decode_tokens; Poisson arrivals at `rate`."""
    prompts, outputs = [], []
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = {"num_prefill_tokens", "num_decode_tokens"} - set(reader.fieldnames or ())
        if missing:
            raise TraceError(f"{path}: not a length trace, missing columns {sorted(missing)}")
        for line, row in enumerate(reader, start=2):
            try:
                prompts.append(int(row["num_prefill_tokens"]))
                outputs.append(int(row["num_decode_tokens"]))
            except (ValueError, TypeError) as exc:
                raise TraceError(f"{path}:{line}: bad row: {exc}") from None
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(prompts))
    arrivals = poisson_arrivals(rng, len(prompts), rate, bursty=False)
    return _workload(arrivals, np.asarray(prompts)[order], np.asarray(outputs)[order])


def read_trace(path: Path, fmt: str, seed: int) -> Workload:
    if not path.exists():
        raise TraceError(f"trace file not found: {path}")
    if fmt == "azure":
        workload = read_azure(path)
    elif fmt == "mooncake":
        workload = read_mooncake(path)
    elif fmt == "lengths":
        workload = read_lengths(path, seed)
    else:
        raise TraceError(f"unknown trace format {fmt!r}; known: {', '.join(TRACE_FORMATS)}")
    if not len(workload):
        raise TraceError(f"{path}: trace has no requests")
    return workload
