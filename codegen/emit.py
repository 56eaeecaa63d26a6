"""Emission of the catalog's rendered modules into generated/ (checked in; CI checks freshness)."""
from __future__ import annotations

from pathlib import Path

from . import GENERATED_DIR
from .catalog import all_catalog_specs
from .render import generated_path, render


def expected_files() -> dict[Path, str]:
    return {generated_path(s): render(s) for s in all_catalog_specs()}


def emit() -> list[Path]:
    """Write every catalog module; delete generated files no spec produces. Returns changed paths."""
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
    """Paths (relative to generated/) that differ from what the templates render now."""
    want = expected_files()
    bad = [p for p, text in want.items() if not p.exists() or p.read_text() != text]
    bad += [p for p in GENERATED_DIR.rglob("*.py") if p not in want]
    return sorted(str(p.relative_to(GENERATED_DIR)) for p in bad)
