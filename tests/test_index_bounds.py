"""Every caller-supplied index reaches an address through one bounded load (CPU, rendered source).

The sparse MLA kernels mask an index outside [0, blocks * 64) of the cache passed like -1, and
the DCP filter drops an owned id past its block table: both rest on the index being read in one
place, behind one unsigned compare. These checks keep a new gather path from reading `indices`
(or the block table) somewhere else."""
import ast
from pathlib import Path

import pytest

from codegen.catalog import all_catalog_specs
from codegen.render import render
from codegen.specs import DcpSpec, SparseMLASpec

SPARSE = [s for s in all_catalog_specs() if isinstance(s, SparseMLASpec)]
ROOT = Path(__file__).resolve().parent.parent


def _with_blocks(source: str) -> str:
    """The rendered module followed by every codegen/cute_blocks module it imports, transitively
    (the kernel code lives there): the checks below read the code the kernel is built from."""
    texts, todo, seen = [source], [(source, None)], set()
    while todo:
        text, package = todo.pop()
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level and package:
                mod = ".".join(package.split(".")[: -node.level] + [node.module or ""])
            else:
                mod = node.module or ""
            if not mod.startswith("codegen.cute_blocks") or mod in seen:
                continue
            seen.add(mod)
            path = ROOT.joinpath(*mod.split(".")).with_suffix(".py")
            block = path.read_text()
            texts.append(block)
            todo.append((block, mod))
    return "\n".join(texts)


def _functions_reading(source: str, name: str) -> set[str]:
    """Names of the functions whose bodies read elements of `name` (mIdx[row, pos]), or of one of
    its lists where it is a (main, extra) pair (mIdx[1][row, pos]); taking a list of the pair
    (mIdx[0].shape) is not a read."""
    def is_list(node):   # mIdx[<int>]: a list of a pair
        return (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == name
                and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, int))

    found = set()
    for fn in ast.walk(ast.parse(source)):
        if isinstance(fn, ast.FunctionDef):
            for node in ast.walk(fn):
                if not isinstance(node, ast.Subscript):
                    continue
                if (isinstance(node.value, ast.Name) and node.value.id == name and not is_list(node)) or \
                        is_list(node.value):
                    found.add(fn.name)
    return found


def _functions_calling(source: str, method: str) -> dict[str, str]:
    """name -> source of the functions whose bodies call self.<method>(...)."""
    found = {}
    for fn in ast.walk(ast.parse(source)):
        if isinstance(fn, ast.FunctionDef):
            for node in ast.walk(fn):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == method):
                    found[fn.name] = ast.unparse(fn)
    return found


@pytest.mark.parametrize("spec", SPARSE, ids=lambda s: s.name)
def test_sparse_mla_reads_indices_only_behind_the_cache_bound(spec):
    """Indices are read in index_at only (or, for a reader that keeps the row's address, through
    index_row in index_at_row alone, behind the same split-end compare), and a slot becomes an
    address (row_address, live_row_address) or a bias (write_bias, or rSlot of the register path)
    only in a function that tests it with live_slot, the unsigned compare against the cache
    tensor's own slots; no consumer tests `>= 0` alone."""
    src = _with_blocks(render(spec))
    assert _functions_reading(src, "mIdx") in ({"index_at"}, {"index_at", "index_row"})
    row_readers = {name for name, body in _functions_calling(src, "gmem_vec").items() if "idx_row" in body}
    assert row_readers <= {"index_at_row"}, f"an index row's address read outside index_at_row: {row_readers}"
    assert "return Uint32(slot) < n_slots" in src
    assert "Uint32(cutlass.max(mKV.shape[0], 0)) * Uint32(self.page_size)" in src   # the bound is the cache tensor's own blocks
    consumers = {**_functions_calling(src, "row_address"), **_functions_calling(src, "live_row_address"),
                 **_functions_calling(src, "write_bias")}
    consumers.pop("row_address", None)
    assert consumers, "no gather found"
    for name, body in consumers.items():
        assert "self.live_slot(" in body, f"{name} turns an index into an address or bias without live_slot"
    assert "rIdx[m] >= 0" not in src and "slot_idx >= 0" not in src and "if slot >= 0" not in src
    if "IndexOrder" in src:
        # the locality pass (extend at 8-32 heads, bf16) copies a row's entries in cache order; it
        # never turns one into an address, and the attention kernel reads its copy through index_at
        order = (ROOT / "codegen/cute_blocks/sparse_mla/order.py").read_text()
        for call in ("row_address(", "gmem_vec(", "write_bias(", "mKV"):
            assert call not in order, f"the locality pass addresses the cache ({call})"


def test_dcp_filter_reads_the_block_table_only_behind_its_bound():
    src = render(DcpSpec(arch="sm_90a"))
    assert _functions_reading(src, "block_table") == {"kernel"}
    assert "if Uint32(local) < n_local:" in src


def test_no_bound_compares_against_a_raw_shape_scalar():
    """`Uint32(t.shape[i])` stays a signed CuTe shape scalar and turns the bound's compare into a
    signed one, so a negative index or block-table entry would pass it (the fused indexer read
    pages at negative block ids that way). A bound is taken through a plain value first, e.g.
    `Uint32(cutlass.max(t.shape[0], 0))`."""
    import re

    from codegen import TEMPLATES_DIR

    bad = []
    for path in sorted(TEMPLATES_DIR.rglob("*.j2")) + sorted((ROOT / "codegen" / "cute_blocks").rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"Uint32\(\s*[\w.]+\.shape\[", line):
                bad.append(f"{path.name}:{n}: {line.strip()}")
    assert not bad, "bounds compared against a raw shape scalar (signed compare):\n" + "\n".join(bad)
