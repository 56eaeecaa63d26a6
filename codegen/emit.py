"""Emission of the catalog: rendered modules into generated/ and their digests into the source
index codegen/source_index.json (both checked in; CI checks freshness).

In a checkout, `emit` writes both and `emit --check` compares both. An installed wheel has no
generated/: there `emit` refuses, and `emit --check` checks the shipped index against the
shipped templates (stale_index)."""
from __future__ import annotations

from pathlib import Path

from . import GENERATED_DIR, PACKAGE_DIR, REPO_ROOT, SOURCE_INDEX_PATH, SOURCE_TREE
from .catalog import all_catalog_specs
from .identity import digest_text, index_json, templates_digest
from .render import generated_path, render
from .specs import KernelSpec


class EmitError(RuntimeError):
    pass


def _rendered() -> dict[KernelSpec, str]:
    return {s: render(s) for s in all_catalog_specs()}


def expected_index(rendered: dict[KernelSpec, str] | None = None) -> str:
    rendered = _rendered() if rendered is None else rendered
    return index_json({s.canonical_json(): digest_text(t) for s, t in rendered.items()}, templates_digest())


def expected_files(rendered: dict[KernelSpec, str] | None = None) -> dict[Path, str]:
    """Every file emit owns: the generated modules and the source index."""
    rendered = _rendered() if rendered is None else rendered
    want = {generated_path(s): t for s, t in rendered.items()}
    want[SOURCE_INDEX_PATH] = expected_index(rendered)
    return want


def _require_checkout() -> None:
    if not SOURCE_TREE:
        raise EmitError(f"emit writes generated/ and codegen/source_index.json of a source checkout; this b12x is "
                        f"installed at {PACKAGE_DIR} (run it in a clone; `emit --check` checks the installed index)")


def emit() -> list[Path]:
    """Write every catalog module and the source index; delete generated files no spec produces.
    Returns changed paths."""
    _require_checkout()
    want = expected_files()
    changed = []
    for path, text in want.items():
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            changed.append(path)
    for path in GENERATED_DIR.rglob("*.py"):
        if path not in want:
            path.unlink()
            changed.append(path)
    return changed


def stale() -> list[str]:
    """Paths (relative to the checkout) that differ from what the templates render now."""
    _require_checkout()
    want = expected_files()
    bad = [p for p, text in want.items() if not p.exists() or p.read_text() != text]
    bad += [p for p in GENERATED_DIR.rglob("*.py") if p not in want]
    return sorted(str(p.relative_to(REPO_ROOT)) for p in bad)


def stale_index() -> list[str]:
    """Installed package: what in the shipped source index differs from the shipped templates'
    rendering (spec names; "templates_sha256" for the templates digest, "unreadable" when absent)."""
    import json

    try:
        have = json.loads(SOURCE_INDEX_PATH.read_text())
    except (OSError, ValueError):
        return ["unreadable"]
    want = json.loads(expected_index())
    bad = ["templates_sha256"] if have.get("templates_sha256") != want["templates_sha256"] else []
    names = {s.canonical_json(): s.name for s in all_catalog_specs()}
    got = have.get("sources") or {}
    bad += sorted(names.get(k, k) for k in set(want["sources"]) | set(got) if got.get(k) != want["sources"].get(k))
    return bad
