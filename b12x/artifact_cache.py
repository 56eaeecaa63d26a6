"""Content-addressed artifact cache.

Layout under $B12X_CACHE_DIR (default ~/.cache/b12x):

    v1/<arch>/<key[:2]>/<key>/kernel.so       the linked kernels of one spec
    v1/<arch>/<key[:2]>/<key>/manifest.json   spec, toolchain, sha256 and size of kernel.so, build report
    v1/<arch>/<key[:2]>/<key>/source.py       the rendered module it was built from (for reading)
    locks/<key>.lock                           one builder per key at a time

The key is sha256 over the spec's canonical JSON, the rendered source, the shared CuTe building
blocks, the pinned toolchain and the arch. The manifest is written last, so an entry without one
was never finished.

Loading a .so runs its code, so an entry is refused (rebuilt, or an error once frozen) unless
every directory from the cache root down and every file of the entry is writable by its owner
only, kernel.so is a regular file with one link (no symlink, no hard link) and the manifest is
complete. The entry is opened component by component without following symlinks, kernel.so is
read once, and its sha256 is checked on those bytes: the loader maps exactly the bytes that
were verified (b12x.loader.load_module_bytes), never the file again.

Builds run in hidden `.<key>.build-*` directories next to the entry; what a killed build or a
killed store() leaves behind (those directories, `.kernel.so.*` / `.manifest.json.*` temp files)
is removed by the next builder of that key, and by `b12x-codegen prune`.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from .errors import CacheError

MANIFEST_FORMAT = 1
SO_NAME = "kernel.so"
MANIFEST_NAME = "manifest.json"
SOURCE_NAME = "source.py"
# the manifest fields store() writes itself (the rest come from the build)
MANIFEST_FORMAT_FIELDS = ("format", "key", "arch", "so")
_TEMP_PREFIXES = tuple(f".{n}." for n in (SO_NAME, MANIFEST_NAME, SOURCE_NAME))  # store()'s temp files
_GROUP_OTHER_W = stat.S_IWGRP | stat.S_IWOTH
_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_O_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a planted FIFO must not hang us


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


class _Refused(Exception):
    """An entry that must not be loaded; the message is the one-line reason."""


def _writable_by_others(st: os.stat_result, what: str) -> None:
    if st.st_mode & _GROUP_OTHER_W:
        raise _Refused(f"{what} is writable by group or others (mode {oct(stat.S_IMODE(st.st_mode))})")


def _why_not_opened(dir_fd: int, name: str, what: str, err: OSError) -> str:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return f"{what} unreadable ({err.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return f"{what} is a symlink"
    if err.errno == errno.ENOTDIR:
        return f"{what} is not a directory"
    return f"{what} unreadable ({err.strerror})"


def _read_regular(dir_fd: int, name: str, *, single_link: bool, expect_size: int | None = None) -> bytes:
    try:
        fd = os.open(name, _O_FILE, dir_fd=dir_fd)
    except FileNotFoundError:
        raise _Refused(f"{name} missing") from None
    except OSError as e:
        raise _Refused(_why_not_opened(dir_fd, name, name, e)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _Refused(f"{name} is not a regular file")
        if single_link and st.st_nlink != 1:
            raise _Refused(f"{name} has {st.st_nlink} hard links (expected 1)")
        _writable_by_others(st, name)
        if expect_size is not None and st.st_size != expect_size:
            raise _Refused(f"{name} truncated or replaced (size {st.st_size}, manifest says {expect_size})")
        chunks, size = [], 0
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
        if expect_size is not None and size != expect_size:
            raise _Refused(f"{name} truncated or replaced (read {size} bytes, manifest says {expect_size})")
        return data
    finally:
        os.close(fd)


def _manifest_problem(m) -> str | None:
    """Why a parsed manifest cannot be used (the key and format are checked before this)."""
    so = m.get("so")
    if so is None:
        return "no 'so'"
    if not isinstance(so, dict):
        return "'so' is not an object"
    size, sha = so.get("size"), so.get("sha256")
    if size is None:
        return "no 'size' in 'so'"
    if sha is None:
        return "no 'sha256' in 'so'"
    if type(size) is not int or size < 0:
        return f"'so' size {size!r} is not a byte count"
    if not isinstance(sha, str) or len(sha) != 64:
        return f"'so' sha256 {sha!r} is not a sha256"
    eps = m.get("entry_points")
    if eps is None:
        return "no 'entry_points'"
    if not isinstance(eps, list) or not all(isinstance(e, str) for e in eps):
        return "'entry_points' is not a list of names"
    return None


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
        self._writable = False

    # -- safety ---------------------------------------------------------------------------
    def _root_error(self, err: OSError) -> CacheError:
        """One line naming the cache dir and what is wrong with it."""
        root = self.root
        for p in (root, *root.parents):
            if os.path.lexists(p):
                if p.is_dir():
                    what = f"cannot create it ({err.strerror})"
                elif p != root:
                    what = f"{p} is {'a file' if p.is_file() else 'not a directory'}, so nothing can be created under it"
                elif p.is_symlink() and not p.exists():
                    what = "is a dangling symlink"
                else:
                    what = "is a file, expected a directory" if p.is_file() else "is not a directory"
                break
        else:
            what = f"cannot create it ({err.strerror})"
        return CacheError(f"cache dir {root}: {what}; set B12X_CACHE_DIR to a directory you own")

    def ensure_root(self) -> Path:
        """Create the cache dir (0700) or refuse one that other users can write: a shared
        writable cache would let anyone substitute code that we then dlopen."""
        if not self._checked:
            try:
                self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
                mode = self.root.stat().st_mode
            except OSError as e:
                raise self._root_error(e) from None
            if not stat.S_ISDIR(mode):
                raise self._root_error(OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR)))
            if mode & _GROUP_OTHER_W:
                raise CacheError(
                    f"cache dir {self.root}: expected not writable by group or others (mode 0o700 or 0o755), "
                    f"got mode {oct(stat.S_IMODE(mode))}; run `chmod go-w {self.root}` or set B12X_CACHE_DIR")
            self._checked = True
        return self.root

    def ensure_writable(self) -> Path:
        """ensure_root(), and a file can really be created there (modes say nothing to root or
        about read-only mounts)."""
        root = self.ensure_root()
        if not self._writable:
            try:
                fd, probe = tempfile.mkstemp(dir=root, prefix=".write-probe.")
                os.close(fd)
                os.unlink(probe)
            except OSError as e:
                raise CacheError(f"cache dir {root}: cannot write in it ({e.strerror}); "
                                 f"set B12X_CACHE_DIR to a directory you own") from None
            self._writable = True
        return root

    def entry_dir(self, key: str, arch: str) -> Path:
        return self.root / "v1" / arch / key[:2] / key

    def _lock_fd(self, key: str) -> int:
        root = self.ensure_writable()
        path = root / "locks" / f"{key}.lock"
        try:
            self._make_dir(root / "locks")
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise CacheError(f"cache dir {root}: cannot open the lock {path} ({e.strerror})") from None

    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[None]:
        fd = self._lock_fd(key)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    @contextlib.contextmanager
    def _try_lock(self, key: str) -> Iterator[bool]:
        fd = self._lock_fd(key)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
            else:
                yield True
        finally:
            os.close(fd)

    # -- read -----------------------------------------------------------------------------
    def _open_entry_dir(self, key: str, arch: str) -> int:
        """An fd of the entry dir, reached from the root one component at a time without
        following symlinks; every level is checked on the fd it was opened as."""
        try:
            fd = os.open(self.root, _O_DIR)
        except FileNotFoundError:
            raise _Refused("missing") from None
        except OSError as e:
            raise _Refused(f"cache dir {self.root} unreadable ({e.strerror})") from None
        try:
            _writable_by_others(os.fstat(fd), f"cache dir {self.root}")
            parts = ("v1", arch, key[:2], key)
            for i, part in enumerate(parts):
                what = "/".join(parts[: i + 1])
                try:
                    nfd = os.open(part, _O_DIR | os.O_NOFOLLOW, dir_fd=fd)
                except FileNotFoundError:
                    raise _Refused("missing") from None
                except OSError as e:
                    raise _Refused(_why_not_opened(fd, part, what, e)) from None
                os.close(fd)
                fd = nfd
                _writable_by_others(os.fstat(fd), what)
            return fd
        except BaseException:
            os.close(fd)
            raise

    def read_verified(self, key: str, arch: str) -> tuple[Artifact | None, bytes | None, str]:
        """(artifact, the bytes of kernel.so, "ok") when the entry is complete, intact and safe
        to load, else (None, None, why). Load these bytes, not the file: they are what was checked."""
        try:
            dfd = self._open_entry_dir(key, arch)
        except _Refused as e:
            return None, None, str(e)
        try:
            try:
                raw = _read_regular(dfd, MANIFEST_NAME, single_link=False)
            except _Refused as e:
                return None, None, "missing" if str(e) == f"{MANIFEST_NAME} missing" else str(e)
            try:
                manifest = json.loads(raw)
            except ValueError as e:
                return None, None, f"corrupt manifest ({e})"
            if not isinstance(manifest, dict):
                return None, None, "corrupt manifest (not a JSON object)"
            if manifest.get("format") != MANIFEST_FORMAT or manifest.get("key") != key:
                return None, None, f"foreign manifest (key {manifest.get('key')!r}, format {manifest.get('format')!r})"
            problem = _manifest_problem(manifest)
            if problem:
                return None, None, f"corrupt manifest ({problem})"
            try:
                data = _read_regular(dfd, SO_NAME, single_link=True, expect_size=manifest["so"]["size"])
                with contextlib.suppress(FileNotFoundError):  # read by people only, but never a way in
                    st = os.stat(SOURCE_NAME, dir_fd=dfd, follow_symlinks=False)
                    if stat.S_ISLNK(st.st_mode):
                        raise _Refused(f"{SOURCE_NAME} is a symlink")
                    _writable_by_others(st, SOURCE_NAME)
            except _Refused as e:
                return None, None, str(e)
            if hashlib.sha256(data).hexdigest() != manifest["so"]["sha256"]:
                return None, None, "kernel.so corrupt (sha256 differs from the manifest)"
            return Artifact(key, self.entry_dir(key, arch), manifest), data, "ok"
        finally:
            os.close(dfd)

    def check(self, key: str, arch: str) -> tuple[Artifact | None, str]:
        """Return (artifact, "ok") when the entry is complete, intact and safe, else (None, why)."""
        art, _, why = self.read_verified(key, arch)
        return art, why

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
    def _make_dir(self, p: Path) -> None:
        """Make p a real directory that only its owner can write: a symlink or a file in its
        place is removed, group/other write bits are dropped."""
        for _ in range(3):
            try:
                st = os.lstat(p)
            except FileNotFoundError:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(p, 0o700)
                continue
            if stat.S_ISDIR(st.st_mode):
                if st.st_mode & _GROUP_OTHER_W:
                    os.chmod(p, stat.S_IMODE(st.st_mode) & ~_GROUP_OTHER_W)
                return
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)
        raise OSError(errno.EEXIST, f"{p} keeps changing under us")

    def _make_entry_dirs(self, key: str, arch: str, *, entry: bool = True) -> Path:
        """The directories down to the entry's (entry=False: down to its parent, where it is built)."""
        root = self.ensure_writable()
        d = self.entry_dir(key, arch)
        try:
            for p in (root / "v1", root / "v1" / arch, d.parent, d)[: 4 if entry else 3]:
                self._make_dir(p)
        except OSError as e:
            raise CacheError(f"cache dir {root}: cannot make {d} safe to use ({e.strerror or e})") from None
        return d

    def _remove_leftovers(self, key: str, arch: str) -> int:
        """Remove what killed builders of this key left behind. Callers hold lock(key)."""
        d = self.entry_dir(key, arch)
        removed = 0
        for parent, prefixes in ((d.parent, (f".{key}.build-",)), (d, _TEMP_PREFIXES)):
            try:
                names = os.listdir(parent)
            except (FileNotFoundError, NotADirectoryError):
                continue
            for name in names:
                if name.startswith(prefixes):
                    p = parent / name
                    if p.is_dir() and not p.is_symlink():
                        shutil.rmtree(p, ignore_errors=True)
                    else:
                        with contextlib.suppress(FileNotFoundError):
                            p.unlink()
                    removed += 1
        return removed

    def clean_leftovers(self) -> int:
        """Remove temp files and build dirs of killed builds, for every key not being built now."""
        removed = 0
        for arch_dir in sorted((self.root / "v1").glob("*")):
            for name in sorted({n.name[1:65] for n in arch_dir.glob("??/.*.build-*")} |
                               {n.parent.name for n in arch_dir.glob("??/*/.*") if n.name.startswith(_TEMP_PREFIXES)}):
                with self._try_lock(name) as mine:
                    if mine:
                        removed += self._remove_leftovers(name, arch_dir.name)
        return removed

    def store(self, key: str, arch: str, so_file: Path, manifest: dict, source: str | None = None) -> Artifact:
        """Copy a built .so into the cache atomically: data first, manifest last, each through
        a temp file (mode 0600) and os.replace, which also replaces a symlink or hard link that
        stood in its place. Callers hold lock(key)."""
        d = self._make_entry_dirs(key, arch)

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

        try:
            data = Path(so_file).read_bytes()
            (d / MANIFEST_NAME).unlink(missing_ok=True)  # the entry is unfinished until the new manifest lands
            if source is not None:
                put(SOURCE_NAME, source.encode())
            put(SO_NAME, data)
            full = {**manifest, "format": MANIFEST_FORMAT, "key": key, "arch": arch,
                    "so": {"file": SO_NAME, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}}
            put(MANIFEST_NAME, json.dumps(full, indent=1, sort_keys=True).encode())
        except OSError as e:
            raise CacheError(f"cache dir {self.root}: cannot write the entry {d} ({e.strerror or e})") from None
        return Artifact(key, d, full)

    def get_or_build(self, key: str, arch: str, build: Callable[[Path], tuple[Path, dict, str | None]]) -> tuple[Artifact, bool]:
        """Return (artifact, built). `build(workdir)` returns (so_path, manifest_fields, source).
        Under the key's lock, so concurrent builders of one spec leave one good artifact."""
        with self.lock(key):
            art, _ = self.check(key, arch)
            if art is not None:
                return art, False
            d = self._make_entry_dirs(key, arch, entry=False)  # the entry dir itself appears with the files
            self._remove_leftovers(key, arch)
            work = Path(tempfile.mkdtemp(prefix=f".{key}.build-", dir=d.parent))
            try:
                so, fields, source = build(work)
                return self.store(key, arch, so, fields, source), True
            finally:
                shutil.rmtree(work, ignore_errors=True)
