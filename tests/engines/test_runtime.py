"""The engine's process environment (loopeval.engines.runtime, ``loopeval engine-env``). Needs no vLLM."""

import importlib.metadata
import importlib.util
import subprocess
import sys

import pytest

from loopeval.engines import runtime


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """An environment whose lib folder holds tcmalloc and libiomp5 (and no intel-openmp or vLLM metadata)."""
    lib = tmp_path / "lib"
    lib.mkdir()
    for name in ("libtcmalloc_minimal.so.4", "libiomp5.so", "libiomp5_db.so", "libother.so"):
        (lib / name).write_bytes(b"")
    monkeypatch.setattr(sys, "prefix", str(tmp_path))

    def no_distribution(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", no_distribution)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    return lib.resolve()


def test_preload_puts_the_missing_libraries_first_and_keeps_the_users(installed):
    tc, iomp = installed / "libtcmalloc_minimal.so.4", installed / "libiomp5.so"
    assert runtime.preload({}) == f"{tc}:{iomp}"
    assert runtime.preload({"LD_PRELOAD": "/opt/a.so"}) == f"{tc}:{iomp}:/opt/a.so"
    # a library the user preloads already (any copy of it) is not added again
    assert runtime.preload({"LD_PRELOAD": "/opt/libiomp5.so:/opt/a.so"}) == f"{tc}:/opt/libiomp5.so:/opt/a.so"


def test_nothing_installed_leaves_ld_preload_alone(tmp_path, monkeypatch, installed):
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "elsewhere"))
    assert runtime.preload({"LD_PRELOAD": "/opt/a.so"}) == "/opt/a.so"
    assert "LD_PRELOAD" not in runtime.engine_environment({"LD_PRELOAD": "/opt/a.so"})


def test_engine_environment_keeps_what_the_user_set(installed):
    env = runtime.engine_environment({"VLLM_CPU_KVCACHE_SPACE": "8"})
    assert "VLLM_CPU_KVCACHE_SPACE" not in env
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == runtime.ENV_DEFAULTS["VLLM_CPU_OMP_THREADS_BIND"]
    assert env["LD_PRELOAD"].split(":") == [str(installed / "libtcmalloc_minimal.so.4"), str(installed / "libiomp5.so")]


def test_export_lines_are_read_back_by_a_shell():
    values = {"LD_PRELOAD": "/a b/lib'x.so:/c.so", "VLLM_CPU_KVCACHE_SPACE": "2"}
    script = runtime.export_lines(values) + 'printf "%s\\n" "$LD_PRELOAD" "$VLLM_CPU_KVCACHE_SPACE"'
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == list(values.values())


def test_the_command_prints_this_environments_settings(capsys):
    from loopeval.cli import main

    assert main(["engine-env"]) == 0
    printed = capsys.readouterr().out
    assert printed == runtime.export_lines(runtime.engine_environment())
