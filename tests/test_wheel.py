"""Install from a wheel, away from the checkout.

The wheel is built from this checkout; each box is a fresh venv and every command runs from a
temporary directory with PYTHONPATH unset, so nothing of the checkout is importable:
- build box: the wheel and its dependencies; `b12x-codegen list`, `build` (the default bundle),
  `verify`, `emit --check` (the shipped index against the shipped templates) and `emit` (refused);
- serving box: torch, apache-tvm-ffi, numpy and the wheel with --no-deps (no jinja2, no
  nvidia-cutlass-dsl), B12X_CUTE_RUNTIME pointing at the build box's libcute_dsl_runtime.so,
  the build box's cache copied over: every catalog key equals the build box's, every op plans,
  and every artifact of the default bundle loads (tvm_ffi.load_module needs no GPU).
"""
import importlib.metadata
import importlib.util
import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHIPPED = ("pyproject.toml", "README.md", "b12x", "codegen", "templates")  # what the wheel is built from
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
           and not k.startswith("B12X_")}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1", **extra)
    return env


def _run(cmd, cwd: Path, env: dict, rc: int | None = 0, timeout: int = 600) -> subprocess.CompletedProcess:
    p = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if rc is not None and p.returncode != rc:
        raise AssertionError(f"{' '.join(map(str, cmd))}: expected exit {rc}, got {p.returncode}\n"
                             f"--- stdout\n{p.stdout[-4000:]}\n--- stderr\n{p.stderr[-4000:]}")
    return p


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A copy of what the wheel is built from (an in-tree build would write build/ into the checkout)."""
    src = tmp_path_factory.mktemp("wheel-src")
    for name in SHIPPED:
        (shutil.copytree(REPO / name, src / name, ignore=IGNORE) if (REPO / name).is_dir()
         else shutil.copy2(REPO / name, src / name))
    return src


@pytest.fixture(scope="module")
def wheel(source, tmp_path_factory) -> Path:
    if importlib.util.find_spec("pip") is None:
        pytest.skip(f"building the wheel needs pip in {sys.executable}")
    dist = tmp_path_factory.mktemp("dist")
    # no build isolation when this interpreter has the build backend pyproject.toml asks for
    try:
        local_backend = int(importlib.metadata.version("setuptools").split(".")[0]) >= 68
    except (importlib.metadata.PackageNotFoundError, ValueError):
        local_backend = False
    isolation = ["--no-build-isolation"] if local_backend else []
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", dist, source], dist, _env())
    (whl,) = dist.glob("b12x-*.whl")
    return whl


def test_wheel_ships_packages_templates_and_source_index(wheel, source):
    names = set(zipfile.ZipFile(wheel).namelist())
    want = {p.relative_to(source).as_posix() for d in ("b12x", "codegen") for p in (source / d).rglob("*")
            if p.is_file()}
    want |= {f"codegen/templates/{p.relative_to(source / 'templates').as_posix()}"
             for p in (source / "templates").rglob("*") if p.is_file()}
    missing = sorted(want - names)
    assert not missing, ("files of the checkout missing from the wheel: add their package to [tool.setuptools] "
                         f"packages, or their pattern to package-data, in pyproject.toml: {missing}")
    assert "codegen/source_index.json" in names
    assert not [n for n in names if n.split("/")[0] in ("templates", "generated", "tests", "benchmarks")]


def _venv(path: Path, env: dict) -> Path:
    p = _run([sys.executable, "-m", "venv", path], path.parent, env, rc=None)
    if p.returncode != 0 and "ensurepip" in p.stdout + p.stderr:
        pytest.skip(f"`{sys.executable} -m venv` cannot install pip here (python3-venv missing): {p.stdout.strip()}")
    assert p.returncode == 0, p.stdout + p.stderr
    return path / "bin"


@pytest.mark.slow
def test_build_box_and_serving_box_from_the_wheel(wheel, tmp_path):
    import torch

    from codegen.catalog import DEFAULT_PRESET, get_preset
    from codegen.toolchain import TVM_FFI_VERSION

    # the CPU wheel this box already has (pip finds it locally; a bare `torch` would be a CUDA build)
    torch_req = f"torch=={torch.__version__.split('+')[0]}"
    helper = tmp_path / "wheel_boxes.py"
    shutil.copy2(Path(__file__).with_name("wheel_boxes.py"), helper)
    env = _env()

    # -- build box: the wheel with its dependencies -------------------------------------------
    bb = _venv(tmp_path / "build-venv", env)
    _run([bb / "pip", "install", "-q", torch_req, wheel], tmp_path, env)
    work = tmp_path / "build-box"
    cache = work / "cache"
    cache.mkdir(parents=True, mode=0o700)
    benv = _env(B12X_CACHE_DIR=str(cache))
    out = _run([bb / "b12x-codegen", "list"], work, benv).stdout
    assert DEFAULT_PRESET in out and "sparse-mla-all" in out
    out = _run([bb / "b12x-codegen", "build"], work, benv).stdout
    default = get_preset(DEFAULT_PRESET).specs(("sm_90a",))
    for s in default:
        assert f"{s.name}: built" in out, out
    out = _run([bb / "b12x-codegen", "verify"], work, benv).stdout
    assert f"{len(default)} artifacts in {cache}, 0 bad" in out, out
    out = _run([bb / "b12x-codegen", "emit", "--check"], work, benv).stdout
    assert "source index is fresh" in out and "no generated/" in out, out
    p = _run([bb / "b12x-codegen", "emit"], work, benv, rc=2)
    assert p.stderr.count("\n") == 1 and "source checkout" in p.stderr, p.stderr
    assert not list(bb.parent.glob("lib/python*/site-packages/generated")), "emit wrote into site-packages"
    keys_file = work / "keys.json"
    info = json.loads(_run([bb / "python", helper, "build-keys", keys_file], work, benv).stdout.splitlines()[-1])
    assert not info["source_tree"] and str(bb.parent) in info["b12x"], info
    runtime = json.loads(keys_file.read_text())["runtime"]

    # -- serving box: no jinja2, no DSL compiler ------------------------------------------------
    sb = _venv(tmp_path / "serve-venv", env)
    _run([sb / "pip", "install", "-q", torch_req, f"apache-tvm-ffi=={TVM_FFI_VERSION}", "numpy"], tmp_path, env)
    _run([sb / "pip", "uninstall", "-q", "-y", "jinja2", "markupsafe"], tmp_path, env)  # torch pulls them in
    _run([sb / "pip", "install", "-q", "--no-deps", wheel], tmp_path, env)
    serve = tmp_path / "serving-box"
    shutil.copytree(cache, serve / "cache")
    assert not stat.S_IMODE((serve / "cache").stat().st_mode) & 0o022
    senv = _env(B12X_CACHE_DIR=str(serve / "cache"), B12X_CUTE_RUNTIME=runtime)
    info = json.loads(_run([sb / "python", helper, "serve", keys_file], serve, senv).stdout.splitlines()[-1])
    assert not info["source_tree"] and str(sb.parent) in info["b12x"], info
    assert info["planned"] == ["dcp", "indexer", "sparse_mla decode", "sparse_mla extend"], info
    assert [x.split(":")[0] for x in info["loaded"]] == [s.name for s in default], info
    out = _run([sb / "b12x-codegen", "verify"], serve, senv).stdout
    assert f"{len(default)} artifacts in {serve / 'cache'}, 0 bad" in out, out
    assert DEFAULT_PRESET in _run([sb / "b12x-codegen", "list"], serve, senv).stdout
    p = _run([sb / "b12x-codegen", "emit", "--check"], serve, senv, rc=2)
    assert p.stderr.count("\n") == 1 and "jinja2" in p.stderr, p.stderr
