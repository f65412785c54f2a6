"""The generated gRPC code in the repo is what `make proto` would generate now."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys

from support import components


def test_generated_code_is_up_to_date(repo, tmp_path) -> None:
    if importlib.util.find_spec("grpc_tools") is None:
        components.missing("grpcio-tools is not installed: pip install -e '.[dev]'")
    (tmp_path / "gpuroute" / "proto").mkdir(parents=True)
    shutil.copy(repo / "gpuroute/proto/load.proto", tmp_path / "gpuroute/proto/load.proto")
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I.", "--python_out=.",
         "--grpc_python_out=.", "--pyi_out=.", "gpuroute/proto/load.proto"],
        cwd=tmp_path, check=True,
    )  # fmt: skip
    for name in ("load_pb2.py", "load_pb2_grpc.py", "load_pb2.pyi"):
        fresh = (tmp_path / "gpuroute/proto" / name).read_text()
        assert (repo / "gpuroute/proto" / name).read_text() == fresh, f"run `make proto` ({name})"
