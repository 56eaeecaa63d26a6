"""The decode partials of 64-head wgmma blocks are stored in O-fragment order (PART_PERMUTED):
the combine's part_col (codegen.cute_blocks.sparse_mla.fragments) must invert the split
epilogue's store_fragments placement exactly."""

from pathlib import Path

import pytest

from codegen.build import _import_from_file
from codegen.render import render
from codegen.specs import SparseMLASpec

pytest.importorskip("cutlass")

from codegen.cute_blocks.sparse_mla.fragments import part_col  # noqa: E402 (needs cutlass)


def _module(tmp_path: Path, **kw):
    spec = SparseMLASpec(**kw)
    path = tmp_path / f"{spec.name}.py"
    path.write_text(render(spec))
    return _import_from_file(path, f"b12x_test_{spec.name}")


def test_part_col_inverts_fragment_stores(tmp_path):
    m = _module(tmp_path, num_heads=128, kv_format="fp8_ds_mla", mode="decode", arch="sm_90a")
    assert m.PART_PERMUTED and m.PART_BLOCK == 256
    # store_fragments: quad lane q's pairs j = 4 mm .. 4 mm + 3 of warpgroup wn go to
    # [wn * 256 + 32 mm + 8 q, + 8), pair k of the chunk at + 2 k, dims 8 j + 2 q + (0, 1)
    placed = {}
    for wn in range(2):
        for q in range(4):
            for j in range(32):
                for e in range(2):
                    pos = wn * 256 + 32 * (j // 4) + 8 * q + 2 * (j % 4) + e
                    placed[pos] = wn * 256 + 8 * j + 2 * q + e
    assert sorted(placed) == list(range(512)) and sorted(placed.values()) == list(range(512))
    assert all(part_col(p, m.PART_BLOCK) == col for p, col in placed.items())
    # the combine stores positions 4 d .. 4 d + 3 as dims c, c + 1, c + 8, c + 9
    for d in range(128):
        c = part_col(4 * d, m.PART_BLOCK)
        assert [part_col(4 * d + i, m.PART_BLOCK) for i in range(4)] == [c, c + 1, c + 8, c + 9]


def test_other_forms_keep_dims_in_order(tmp_path):
    for kw in (dict(num_heads=16, mode="decode", arch="sm_90a"),
               dict(num_heads=128, mode="decode", arch="sm_120a"),
               dict(num_heads=128, mode="extend", arch="sm_90a")):
        assert not _module(tmp_path, **kw).PART_PERMUTED, kw
