"""Every caller-supplied index reaches an address through one bounded load (CPU, rendered source).

The sparse MLA kernels mask an index outside [0, blocks * 64) of the cache passed like -1, and
the DCP filter drops an owned id past its block table: both rest on the index being read in one
place, behind one unsigned compare. These checks keep a new gather path from reading `indices`
(or the block table) somewhere else."""
import ast

import pytest

from codegen.catalog import all_catalog_specs
from codegen.render import render
from codegen.specs import DcpSpec, SparseMLASpec

SPARSE = [s for s in all_catalog_specs() if isinstance(s, SparseMLASpec)]


def _functions_reading(source: str, name: str) -> set[str]:
    """Names of the functions whose bodies subscript `name` (e.g. mIdx[row, pos])."""
    found = set()
    for fn in ast.walk(ast.parse(source)):
        if isinstance(fn, ast.FunctionDef):
            for node in ast.walk(fn):
                if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == name:
                    found.add(fn.name)
    return found


@pytest.mark.parametrize("spec", SPARSE, ids=lambda s: s.name)
def test_sparse_mla_reads_indices_only_behind_the_cache_bound(spec):
    src = render(spec)
    assert _functions_reading(src, "mIdx") == {"index_at"}
    fn = next(f for f in ast.walk(ast.parse(src)) if isinstance(f, ast.FunctionDef) and f.name == "index_at")
    body = ast.unparse(fn)
    assert "Uint32(idx) < n_slots" in body and "slot = idx" in body
    assert "Uint32(cutlass.max(mKV.shape[0], 0)) * Uint32(PAGE_SIZE)" in src   # the bound is the cache tensor's own blocks


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
    for path in sorted(TEMPLATES_DIR.rglob("*.j2")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"Uint32\(\s*[\w.]+\.shape\[", line):
                bad.append(f"{path.name}:{n}: {line.strip()}")
    assert not bad, "bounds compared against a raw shape scalar (signed compare):\n" + "\n".join(bad)
