"""Artifact keys without jinja2: the shipped source index gives the same keys as rendering, is
fresh, is refused when the templates changed under it, and serving resolves with jinja2 and the
DSL compiler blocked (a subprocess)."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from b12x.artifact_cache import artifact_key
from b12x.errors import ArtifactMissingError
from codegen import SOURCE_INDEX_PATH, emit, identity
from codegen.catalog import all_catalog_specs
from codegen.specs import DcpSpec, SparseMLASpec

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def no_render(monkeypatch):
    """This process as a serving box sees it: keys come from the index."""
    monkeypatch.setattr(identity, "can_render", lambda: False)
    identity.shipped_index.cache_clear()
    yield
    identity.shipped_index.cache_clear()


def test_index_keys_equal_rendered_keys(monkeypatch):
    specs = all_catalog_specs()
    rendered = [artifact_key(s) for s in specs]
    monkeypatch.setattr(identity, "can_render", lambda: False)
    identity.shipped_index.cache_clear()
    try:
        indexed = [artifact_key(s) for s in specs]
    finally:
        identity.shipped_index.cache_clear()
    assert indexed == rendered
    assert len(set(rendered)) == len(specs)


def test_shipped_index_is_fresh():
    assert SOURCE_INDEX_PATH.read_text() == emit.expected_index(), "run `b12x-codegen emit`"
    assert emit.stale_index() == []


def test_key_changes_with_the_rendered_source(monkeypatch):
    spec = SparseMLASpec(num_heads=16)
    before = artifact_key(spec)
    import codegen.render

    monkeypatch.setattr(codegen.render, "render", lambda s: "# another module\n")
    assert artifact_key(spec) != before


def test_stale_index_entry_is_reported(tmp_path, monkeypatch):
    body = json.loads(SOURCE_INDEX_PATH.read_text())
    spec = DcpSpec(arch="sm_90a")
    body["sources"][spec.canonical_json()] = "0" * 64
    bad = tmp_path / "source_index.json"
    bad.write_text(json.dumps(body))
    monkeypatch.setattr(emit, "SOURCE_INDEX_PATH", bad)
    assert emit.stale_index() == [spec.name]


def test_spec_outside_the_index_names_the_spec_and_the_fix(no_render):
    spec = SparseMLASpec(num_heads=16, topk=1024)
    with pytest.raises(ArtifactMissingError, match="not in the source index .*b12x-codegen emit") as e:
        artifact_key(spec)
    assert spec.name in str(e.value) and spec.canonical_json() in str(e.value)


def test_index_of_other_templates_is_refused(no_render, monkeypatch):
    monkeypatch.setattr(identity, "templates_digest", lambda root=None: "f" * 64)
    with pytest.raises(ArtifactMissingError, match="stale: the templates .* changed.*b12x-codegen emit"):
        artifact_key(SparseMLASpec(num_heads=16))


def test_emit_refuses_outside_a_checkout(monkeypatch):
    monkeypatch.setattr(emit, "SOURCE_TREE", False)
    with pytest.raises(emit.EmitError, match="source checkout"):
        emit.emit()


BLOCKED = textwrap.dedent("""
    import json, sys

    # as if jinja2 and the DSL compiler were not installed: import raises, find_spec says None
    for name in ("jinja2", "markupsafe", "cutlass", "nvidia_cutlass_dsl"):
        sys.modules[name] = None
    import b12x
    from b12x import registry
    from b12x.artifact_cache import artifact_key
    from b12x.errors import ArtifactMissingError
    from codegen.specs import DcpSpec, SparseMLASpec

    spec = DcpSpec(arch="sm_90a")
    k = registry.resolve(spec)
    try:
        registry.resolve(SparseMLASpec(num_heads=16, topk=1024))
        missing = None
    except ArtifactMissingError as e:
        missing = str(e)
    print(json.dumps({"key": artifact_key(spec), "artifact": k.artifact.key, "functions": sorted(k.functions),
                      "dsl_available": registry.dsl_available(), "missing": missing,
                      "leaked": [m for m, v in sys.modules.items() if v is not None and m.split(".")[0] in ("jinja2", "cutlass")]}))
""")


@pytest.mark.slow
def test_resolve_with_jinja2_and_the_dsl_blocked(tmp_cache, tmp_path):
    from b12x.loader import runtime_library_path
    from codegen.build import build_specs

    spec = DcpSpec(arch="sm_90a")
    (built,) = build_specs([spec])
    env = {**os.environ, "PYTHONPATH": str(REPO), "B12X_CUTE_RUNTIME": runtime_library_path()}
    p = subprocess.run([sys.executable, "-c", BLOCKED], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-4000:]
    got = json.loads(p.stdout.splitlines()[-1])
    assert got["key"] == got["artifact"] == built.key
    assert got["functions"] == sorted(built.kernels)
    assert got["dsl_available"] is False and got["leaked"] == []
    assert "not in the source index" in got["missing"] and "b12x-codegen emit" in got["missing"]
