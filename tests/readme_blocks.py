"""The README's code examples, as the tests read them, and a static check of the b12x calls in them.

A block is found by its section: the first ```python fence after the `## <heading>` line whose text
starts with the given heading, before the next `## `. Editing a block's text keeps it tested; renaming
its heading means updating README_SECTIONS here (the tests then fail naming the missing heading).

`check_calls` walks a block in order without running it: imports are resolved, names bound by
assignment carry the type their call returns (a b12x class, or the return annotation of a b12x
function), and every call of a b12x function, class or method is bound against its
`inspect.signature`, so a missing function, an unknown keyword or a missing required argument is
reported with the line of the example. Names the example leaves to the reader (q, kv_cache, ...)
are unknown and pass; attributes of b12x objects must exist."""
from __future__ import annotations

import ast
import builtins
import dataclasses
import importlib
import inspect
import re
import typing
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"

# The README sections whose first python block the tests run or check (heading prefixes).
README_SECTIONS = {
    "engine": "Engine call sequence",
    "v4": "DeepSeek-V4 sparse attention",
    "indexer": "Lightning indexer",
    "dcp": "DCP global top-k",
    "upstream": "Using b12x from the vLLM B12X backend",
}


def readme_text() -> str:
    return README.read_text()


def python_block(section: str, text: str | None = None) -> str:
    """The first ```python block of README section `section` (a key of README_SECTIONS)."""
    heading = README_SECTIONS[section]
    lines = (text if text is not None else readme_text()).splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith("## ") and ln[3:].strip().startswith(heading)),
                 None)
    if start is None:
        raise AssertionError(f"README.md: no section '## {heading}...' (tests/readme_blocks.py README_SECTIONS)")
    body: list[str] | None = None
    for ln in lines[start + 1:]:
        if ln.startswith("## "):
            break
        if body is None:
            if ln.strip() == "```python":
                body = []
        elif ln.strip() == "```":
            return "\n".join(body) + "\n"
        else:
            body.append(ln)
    raise AssertionError(f"README.md: section '## {heading}' has no complete ```python block")


def inline_b12x_calls(text: str | None = None) -> list[str]:
    """Inline code spans of the README prose that are a call of a `b12x.` name."""
    spans = re.findall(r"`(b12x\.[\w.]+\([^`]*\))`", text if text is not None else readme_text())
    out = []
    for s in spans:
        try:
            node = ast.parse(s, mode="eval").body
        except SyntaxError:
            continue
        if isinstance(node, ast.Call):
            out.append(s)
    return out


def docstring_code(doc: str) -> str:
    """The indented code lines of a docstring (its example), dedented."""
    return "\n".join(ln[4:] for ln in doc.splitlines() if ln.startswith("    ")) + "\n"


# ---- the static check -----------------------------------------------------------------------
def _is_b12x(obj) -> bool:
    name = obj.__name__ if inspect.ismodule(obj) else getattr(obj, "__module__", None) or ""
    return name == "b12x" or name.startswith("b12x.")


@dataclasses.dataclass(frozen=True)
class _Obj:            # a known object: a module, function, class
    value: object


@dataclasses.dataclass(frozen=True)
class _Inst:           # an instance of a known b12x class
    cls: type


@dataclasses.dataclass(frozen=True)
class _Method:         # cls.name looked up on an instance
    cls: type
    name: str


def _returned(fn) -> object:
    """What calling fn gives, as far as its return annotation says (an instance of a b12x class)."""
    if inspect.isclass(fn):
        return _Inst(fn)
    ann = getattr(fn, "__annotations__", {}).get("return")
    if isinstance(ann, str):
        try:
            ann = eval(ann, getattr(fn, "__globals__", {}))
        except Exception:  # an annotation this process cannot evaluate: the result stays unknown
            return None
    return _Inst(ann) if inspect.isclass(ann) and _is_b12x(ann) else None


def _has_attr(cls: type, name: str) -> bool:
    if hasattr(cls, name):
        return True
    if dataclasses.is_dataclass(cls) and name in {f.name for f in dataclasses.fields(cls)}:
        return True
    try:
        src = inspect.getsource(cls)
    except (OSError, TypeError):
        return False
    return re.search(rf"\bself\.{re.escape(name)}\s*[:=]", src) is not None


def _attr_type(cls: type, name: str) -> object:
    try:
        hints = typing.get_type_hints(cls)
    except Exception:
        return None
    ann = hints.get(name)
    return _Inst(ann) if inspect.isclass(ann) and _is_b12x(ann) else None


class _Checker:
    def __init__(self, where: str, env: dict[str, object]):
        self.where = where
        self.env = dict(env)
        self.errors: list[str] = []
        self.checked: list[str] = []   # qualified names of the b12x calls bound against a signature

    def fail(self, node: ast.AST, msg: str) -> None:
        self.errors.append(f"{self.where}, line {node.lineno}: {msg}")

    # statements
    def run(self, tree: ast.Module) -> None:
        for stmt in tree.body:
            self.stmt(stmt)

    def stmt(self, node: ast.stmt) -> None:
        if isinstance(node, ast.Import):
            for a in node.names:
                try:
                    mod = importlib.import_module(a.name)
                except ImportError as e:
                    self.fail(node, f"import {a.name}: {e}")
                    continue
                top = a.name.split(".")[0]
                self.env[a.asname or top] = _Obj(mod if a.asname else importlib.import_module(top))
        elif isinstance(node, ast.ImportFrom):
            try:
                mod = importlib.import_module(node.module)
            except ImportError as e:
                self.fail(node, f"from {node.module} import ...: {e}")
                return
            for a in node.names:
                if hasattr(mod, a.name):
                    self.env[a.asname or a.name] = _Obj(getattr(mod, a.name))
                else:
                    try:
                        self.env[a.asname or a.name] = _Obj(importlib.import_module(f"{node.module}.{a.name}"))
                    except ImportError:
                        self.fail(node, f"{node.module} has no {a.name}")
        elif isinstance(node, ast.Assign):
            val = self.expr(node.value)
            for t in node.targets:
                self.bind(t, val)
        elif isinstance(node, ast.Expr):
            self.expr(node.value)
        else:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.expr):
                    self.expr(child)
                elif isinstance(child, ast.stmt):
                    self.stmt(child)

    def bind(self, target: ast.expr, val) -> None:
        if isinstance(target, ast.Name):
            self.env[target.id] = val
        elif isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                self.bind(t, None)
        else:
            self.expr(target)

    # expressions
    def expr(self, node: ast.expr):
        if isinstance(node, ast.Name):
            return self.env.get(node.id)
        if isinstance(node, ast.Attribute):
            return self.attribute(node)
        if isinstance(node, ast.Call):
            return self.call(node)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self.expr(child)
        return None

    def attribute(self, node: ast.Attribute):
        base = self.expr(node.value)
        if isinstance(base, _Obj):
            obj = base.value
            if not hasattr(obj, node.attr):
                if _is_b12x(obj):
                    self.fail(node, f"{getattr(obj, '__name__', obj)} has no attribute {node.attr!r}")
                return None
            return _Obj(getattr(obj, node.attr))
        if isinstance(base, _Inst):
            if not _has_attr(base.cls, node.attr):
                self.fail(node, f"{base.cls.__qualname__} has no attribute {node.attr!r}")
                return None
            static = inspect.getattr_static(base.cls, node.attr, None)
            if callable(static) or isinstance(static, (staticmethod, classmethod)):
                return _Method(base.cls, node.attr)
            if isinstance(static, property):
                return _returned(static.fget)
            return _attr_type(base.cls, node.attr)
        return None

    def call(self, node: ast.Call):
        if isinstance(node.func, ast.Name) and node.func.id not in self.env and not hasattr(builtins, node.func.id):
            self.fail(node, f"calls {node.func.id}(), which the example neither imports nor defines")
        func = self.expr(node.func)
        for a in node.args:
            self.expr(a.value if isinstance(a, ast.Starred) else a)
        for k in node.keywords:
            self.expr(k.value)
        if isinstance(func, _Obj) and callable(func.value) and _is_b12x(func.value):
            target, skip_self = func.value, False
            name = f"{target.__module__}.{getattr(target, '__qualname__', target)}"
        elif isinstance(func, _Method):
            static = inspect.getattr_static(func.cls, func.name)
            target = getattr(func.cls, func.name)
            skip_self = not isinstance(static, (staticmethod, classmethod))
            name = f"{func.cls.__module__}.{func.cls.__qualname__}.{func.name}"
        else:
            return None
        self.checked.append(name)
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            return _returned(target)
        try:
            sig = inspect.signature(target)
        except (TypeError, ValueError):
            return _returned(target)
        args = [None] * (len(node.args) + (1 if skip_self else 0))
        try:
            sig.bind(*args, **{k.arg: None for k in node.keywords})
        except TypeError as e:
            self.fail(node, f"{name}{sig}: {e} (as called: {ast.unparse(node)})")
        return _returned(target)


def check_calls(code: str, where: str, env: dict[str, object] | None = None) -> tuple[list[str], list[str]]:
    """(errors, the b12x calls checked, by qualified name) for example code; env pre-binds names."""
    checker = _Checker(where, {k: _Obj(v) for k, v in (env or {}).items()})
    try:
        tree = ast.parse(code)
    except SyntaxError as e:
        return [f"{where}, line {e.lineno}: not valid Python ({e.msg}): {e.text!r}"], []
    checker.run(tree)
    return checker.errors, checker.checked


def free_names(code: str) -> set[str]:
    """Names the code reads before (or without) binding them: what a prelude must define."""
    tree = ast.parse(code)
    bound: set[str] = set()
    free: set[str] = set()
    for stmt in tree.body:
        reads = [n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
        free |= {n for n in reads if n not in bound}
        for n in ast.walk(stmt):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                bound.add(n.id)
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                bound |= {(a.asname or a.name).split(".")[0] for a in n.names}
    return free - set(dir(builtins))
