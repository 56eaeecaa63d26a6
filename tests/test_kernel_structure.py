"""The shape DESIGN.md "How the kernel code is organised" asks of the sparse MLA kernel code:
jinja substitutes constants and chooses blocks, so no `{% if %}` / `{% elif %}` / `{% for %}`
sits inside a function body (signature included); and a generated module is thin: it imports
the building blocks of codegen/cute_blocks/sparse_mla (kernel base, gather, MMA form,
epilogue, combine, fakes) and holds only the spec, the tiling and a small config class."""
import ast
import re
from pathlib import Path

from codegen import TEMPLATES_DIR
from codegen.catalog import all_catalog_specs
from codegen.render import render
from codegen.specs import SparseMLASpec

BLOCKS_DIR = Path(__file__).resolve().parent.parent / "codegen" / "cute_blocks" / "sparse_mla"
SPARSE_MLA_TEMPLATES = sorted({SparseMLASpec.template, *(
    p.relative_to(TEMPLATES_DIR).as_posix() for p in TEMPLATES_DIR.glob("sparse_mla*/**/*.j2"))})
_TAG = re.compile(r"\{%-?\s*(if|elif|for)\b")
_DEF = re.compile(r"^(\s*)(?:async\s+)?def\s")


def in_body_control(source: str) -> list[int]:
    """Line numbers of the jinja if/elif/for tags that lie inside a def (its signature or body):
    the code line before the tag is part of an open def, and so is the code line after it (a
    tag between two methods, choosing which method the class gets, is not in a body)."""
    lines = source.splitlines()
    # for each code line (not blank, not a jinja tag, not a jinja comment): the indentation of
    # the def it belongs to, or None
    owner: dict[int, int | None] = {}
    open_def: int | None = None
    in_signature = False
    for i, line in enumerate(lines):
        text = line.strip()
        if not text or text.startswith(("{%", "{#")):
            continue
        indent = len(line) - len(line.lstrip())
        m = _DEF.match(line)
        if m:
            open_def, in_signature = len(m.group(1)), not text.rstrip().endswith(":")
            owner[i] = open_def
            continue
        if in_signature:
            owner[i] = open_def
            in_signature = not re.search(r"\)\s*(->[^:]*)?:\s*(#.*)?$", text)
            continue
        if open_def is not None and indent <= open_def and not text.startswith(("#", ")", "]", '"""')):
            open_def = None
        owner[i] = open_def
    code = sorted(owner)
    hits = []
    for i, line in enumerate(lines):
        if not _TAG.search(line):
            continue
        before = [j for j in code if j < i]
        after = [j for j in code if j > i]
        if not before or not after:
            continue
        b, a = owner[before[-1]], owner[after[0]]
        if b is not None and a is not None and a == b and _indent(lines[after[0]]) > a:
            hits.append(i + 1)
    return hits


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def test_checker_finds_tags_in_bodies_and_signatures_only():
    src = ("class K:\n{% if a %}\n    def f(self,\n{% if b %}\n              x,\n{% endif %}\n"
           "              y):\n        z = 1\n{% for i in r %}\n        z += {{ i }}\n{% endfor %}\n"
           "        return z\n\n{% endif %}\n{% if c %}\n    def g(self):\n        pass\n{% endif %}\n")
    assert in_body_control(src) == [4, 9]


def test_no_jinja_control_in_function_bodies():
    for name in SPARSE_MLA_TEMPLATES:
        hits = in_body_control((TEMPLATES_DIR / name).read_text())
        assert not hits, f"{name}: jinja control inside function bodies at lines {hits}"


def test_blocks_are_plain_python():
    files = sorted(BLOCKS_DIR.rglob("*.py"))
    assert files
    for f in files:
        text = f.read_text()
        assert "{%" not in text and "{{" not in text, f
        ast.parse(text)


def _block_names() -> set[str]:
    """Top-level functions and classes the sparse MLA blocks define."""
    names = set()
    for f in BLOCKS_DIR.rglob("*.py"):
        for node in ast.parse(f.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names.add(node.name)
    return names


def test_generated_sparse_mla_modules_import_their_blocks():
    specs = [s for s in all_catalog_specs() if isinstance(s, SparseMLASpec)]
    assert specs
    blocks = _block_names()
    for spec in specs:
        tree = ast.parse(render(spec))
        imported = {a.asname or a.name for node in tree.body if isinstance(node, ast.ImportFrom)
                    and (node.module or "").startswith("codegen.cute_blocks.sparse_mla") for a in node.names}
        assert imported & {"SplitKernel", "ExtendKernel", "TwoListsSplitKernel", "TwoListsExtendKernel"}, spec.name
        assert imported & {"Bf16Gather", "Fp8RawGather", "Fp8RegsGather", "Model1RegsGather", "Model1TwoListsGather", "Fp8Producer", "Model1Producer", "Model1TwoListsProducer", "Model1RawGather", "Model1TwoListsRaw"}, spec.name
        assert imported & {"WarpMma", "Wgmma64Heads", "WgmmaHeadsAsN"}, spec.name
        assert "split_fakes" in imported, spec.name
        if spec.mode == "decode":
            assert {"SparseMlaCombine", "combine_fakes"} <= imported, spec.name
        # thin: the kernel class holds only its config (__init__), the functions only build fakes
        classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
        assert len(classes) == 1, spec.name
        cls = classes[0]
        assert cls.name == ("SparseMlaExtend" if spec.mode == "extend" else "SparseMlaSplit"), spec.name
        assert [n.name for n in cls.body if isinstance(n, ast.FunctionDef)] == ["__init__"], spec.name
        functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert functions <= {"make_split_fakes", "make_combine_fakes"}, spec.name
        defined = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        assert not defined & blocks, f"{spec.name} pastes blocks: {sorted(defined & blocks)}"
