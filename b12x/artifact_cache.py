"""Content-addressed artifact cache.

Layout under $B12X_CACHE_DIR (default ~/.cache/b12x):

    v1/<arch>/<key[:2]>/<key>/kernel.so       the linked kernels of one spec
    v1/<arch>/<key[:2]>/<key>/manifest.json   spec, toolchain, sha256 and size of kernel.so, build report
    v1/<arch>/<key[:2]>/<key>/source.py       the rendered module it was built from (for reading)
    locks/<key>.lock                           one builder per key at a time

The key is sha256 over the spec's canonical JSON, the rendered source, the shared CuTe building
blocks, the pinned toolchain and the arch. The manifest is written last, so an entry without one
was never finished; kernel.so is checked against the manifest's sha256 before it is ever loaded.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from .errors import CacheError

MANIFEST_FORMAT = 1
SO_NAME = "kernel.so"


def default_cache_dir() -> Path:
    env = os.environ.get("B12X_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "b12x"


def artifact_key(spec) -> str:
    """The content address of a spec's artifact. Pure Python, and no jinja2 needed: the rendered
    module enters as its sha256, rendered where the templates and jinja2 are at hand, else read
    from the source index that ships with the package (codegen/identity.py)."""
    from codegen.identity import cute_blocks_hash, source_digest
    from codegen.toolchain import toolchain_id

    h = hashlib.sha256()
    for part in (spec.canonical_json(), source_digest(spec), cute_blocks_hash(), toolchain_id(), spec.arch):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class Artifact:
    key: str
    dir: Path
    manifest: dict

    @property
    def so_path(self) -> Path:
        return self.dir / SO_NAME

    @property
    def entry_points(self) -> list[str]:
        return list(self.manifest["entry_points"])


class ArtifactCache:
    def __init__(self, root: Path | str | None = None):
        self.root = Path(root).expanduser() if root is not None else default_cache_dir()
        self._checked = False

    # -- safety ---------------------------------------------------------------------------
    def ensure_root(self) -> Path:
        """Create the cache dir (0700) or refuse one that other users can write: a shared
        writable cache would let anyone substitute code that we then dlopen."""
        if not self._checked:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            mode = self.root.stat().st_mode
            if mode & (stat.S_IWGRP | stat.S_IWOTH):
                raise CacheError(
                    f"cache dir {self.root}: expected not writable by group or others (mode 0o700 or 0o755), "
                    f"got mode {oct(stat.S_IMODE(mode))}; run `chmod go-w {self.root}` or set B12X_CACHE_DIR")
            self._checked = True
        return self.root

    def entry_dir(self, key: str, arch: str) -> Path:
        return self.root / "v1" / arch / key[:2] / key

    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[None]:
        locks = self.ensure_root() / "locks"
        locks.mkdir(exist_ok=True)
        with open(locks / f"{key}.lock", "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    # -- read -----------------------------------------------------------------------------
    def check(self, key: str, arch: str) -> tuple[Artifact | None, str]:
        """Return (artifact, "ok") when the entry is complete and intact, else (None, why)."""
        d = self.entry_dir(key, arch)
        mpath = d / "manifest.json"
        if not mpath.exists():
            return None, "missing"
        try:
            manifest = json.loads(mpath.read_text())
        except (OSError, ValueError) as e:
            return None, f"corrupt manifest ({e})"
        if manifest.get("format") != MANIFEST_FORMAT or manifest.get("key") != key:
            return None, f"foreign manifest (key {manifest.get('key')!r}, format {manifest.get('format')!r})"
        so = d / SO_NAME
        if not so.exists():
            return None, "kernel.so missing"
        size = so.stat().st_size
        if size != manifest["so"]["size"]:
            return None, f"kernel.so truncated or replaced (size {size}, manifest says {manifest['so']['size']})"
        if _sha256_file(so) != manifest["so"]["sha256"]:
            return None, "kernel.so corrupt (sha256 differs from the manifest)"
        return Artifact(key, d, manifest), "ok"

    def lookup(self, key: str, arch: str) -> Artifact | None:
        self.ensure_root()
        return self.check(key, arch)[0]

    def entries(self) -> Iterator[tuple[str, str, Path]]:
        """(arch, key, dir) of every entry on disk, finished or not."""
        base = self.root / "v1"
        if not base.is_dir():
            return
        for arch_dir in sorted(base.iterdir()):
            for d in sorted(arch_dir.glob("??/*")):
                if d.is_dir() and not d.name.startswith("."):
                    yield arch_dir.name, d.name, d

    # -- write ----------------------------------------------------------------------------
    def store(self, key: str, arch: str, so_file: Path, manifest: dict, source: str | None = None) -> Artifact:
        """Copy a built .so into the cache atomically: data first, manifest last, each through
        a temp file and os.replace. Callers hold lock(key)."""
        d = self.entry_dir(key, arch)
        d.mkdir(parents=True, exist_ok=True)

        def put(name: str, data: bytes) -> None:
            fd, tmp = tempfile.mkstemp(dir=d, prefix=f".{name}.")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, d / name)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise

        data = Path(so_file).read_bytes()
        (d / "manifest.json").unlink(missing_ok=True)  # the entry is unfinished until the new manifest lands
        if source is not None:
            put("source.py", source.encode())
        put(SO_NAME, data)
        full = {**manifest, "format": MANIFEST_FORMAT, "key": key, "arch": arch,
                "so": {"file": SO_NAME, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}}
        put("manifest.json", json.dumps(full, indent=1, sort_keys=True).encode())
        return Artifact(key, d, full)

    def get_or_build(self, key: str, arch: str, build: Callable[[Path], tuple[Path, dict, str | None]]) -> tuple[Artifact, bool]:
        """Return (artifact, built). `build(workdir)` returns (so_path, manifest_fields, source).
        Under the key's lock, so concurrent builders of one spec leave one good artifact."""
        with self.lock(key):
            art, _ = self.check(key, arch)
            if art is not None:
                return art, False
            with tempfile.TemporaryDirectory(prefix="b12x-build-") as tmp:
                so, fields, source = build(Path(tmp))
                return self.store(key, arch, so, fields, source), True
