"""What an artifact's key is made of, computable on a serving box without jinja2.

The key (b12x.artifact_cache.artifact_key) covers the sha256 of the spec's rendered module.
Where jinja2 and the templates are at hand (a checkout, a build box) the module is rendered and
hashed. Elsewhere the digest comes from the source index, codegen/source_index.json: `b12x-codegen
emit` writes it for every catalog spec, the wheel ships it, and `emit --check` (CI) keeps it equal
to what the templates render, so both ways give the same key. Nothing here imports jinja2."""
from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

from . import PACKAGE_DIR, SOURCE_INDEX_PATH, TEMPLATES_DIR

INDEX_FORMAT = 1
# What the wheel ships of templates/ (pyproject.toml, package-data of codegen.templates), and so
# what the index's templates digest covers.
TEMPLATE_GLOB = "**/*.j2"
# Python sources the generated modules import at build time; they shape the compiled code, so
# they are hashed into every artifact key along with the rendered module.
CUTE_BLOCKS_DIR = PACKAGE_DIR / "cute_blocks"


def hash_files(paths, root: Path) -> str:
    """sha256 over files, each named by its path relative to `root`, in that order."""
    h = hashlib.sha256()
    for rel in sorted(Path(p).relative_to(root).as_posix() for p in paths):
        h.update(rel.encode())
        h.update(b"\0")
        h.update((root / rel).read_bytes())
        h.update(b"\0")
    return h.hexdigest()


@lru_cache(maxsize=1)
def cute_blocks_hash() -> str:
    return hash_files(CUTE_BLOCKS_DIR.rglob("*.py") if CUTE_BLOCKS_DIR.is_dir() else [], CUTE_BLOCKS_DIR)


def digest_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@lru_cache(maxsize=1)
def can_render() -> bool:
    """jinja2 is importable and the templates are present (a checkout, or a wheel's build box)."""
    if not TEMPLATES_DIR.is_dir():
        return False
    try:
        import jinja2  # noqa: F401
    except ImportError:
        return False
    return True


def templates_digest(root: Path = TEMPLATES_DIR) -> str:
    """sha256 over every template file (relative path and bytes)."""
    return hash_files(root.glob(TEMPLATE_GLOB), root)


def index_json(sources: dict[str, str], templates_sha256: str) -> str:
    """The text of source_index.json: canonical spec JSON -> sha256 of its rendered module."""
    body = {"format": INDEX_FORMAT,
            "about": "written by `b12x-codegen emit`; do not edit. sources: canonical spec JSON -> sha256 of "
                     "the rendered module; templates_sha256: the templates it was rendered from",
            "templates_sha256": templates_sha256,
            "sources": dict(sorted(sources.items()))}
    return json.dumps(body, indent=1, sort_keys=True) + "\n"


def _missing(what: str):
    from b12x.errors import ArtifactMissingError

    return ArtifactMissingError(what)


@lru_cache(maxsize=1)
def shipped_index() -> dict:
    try:
        body = json.loads(SOURCE_INDEX_PATH.read_text())
    except (OSError, ValueError) as e:
        raise _missing(f"source index {SOURCE_INDEX_PATH}: expected the JSON file `b12x-codegen emit` writes "
                       f"(it ships in the wheel), got {e}") from None
    if body.get("format") != INDEX_FORMAT:
        raise _missing(f"source index {SOURCE_INDEX_PATH}: expected format {INDEX_FORMAT}, got {body.get('format')!r}")
    if TEMPLATES_DIR.is_dir() and templates_digest() != body.get("templates_sha256"):
        raise _missing(f"source index {SOURCE_INDEX_PATH} is stale: the templates in {TEMPLATES_DIR} changed "
                       f"since it was written; run `b12x-codegen emit` (or install jinja2, so keys are rendered)")
    return body


def indexed_digest(spec) -> str:
    """The rendered module's sha256 from the shipped index (no rendering)."""
    index = shipped_index()
    digest = index["sources"].get(spec.canonical_json())
    if digest is None:
        raise _missing(
            f"kernel {spec.name}: not in the source index {SOURCE_INDEX_PATH} ({len(index['sources'])} catalog specs) "
            f"and this box cannot render templates (jinja2 is not installed), so its artifact key is unknown; "
            f"add it to a preset in codegen/catalog.py and run `b12x-codegen emit` (then rebuild the wheel), "
            f"or install jinja2 (spec {spec.canonical_json()})")
    return digest


def source_digest(spec) -> str:
    """sha256 of the spec's rendered module: rendered where possible, else from the index."""
    if can_render():
        from .render import render

        return digest_text(render(spec))
    return indexed_digest(spec)
