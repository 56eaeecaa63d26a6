"""The indexer's paged K cache, DeepGEMM's layout: [blocks, 64, 132] bytes, each page 64 rows of
128 e4m3 dims, then the 64 rows' fp32 scales; pages are reached through a block table. What the
logits and the fused score-and-select kernels read of it, written once here."""
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32, const_expr

from .fp8_mma import HEAD_DIM, load_16b, load_f32, load_u32

PAGE_SIZE = 64                      # tokens of a page (the specs allow only 64)
SCALE_OFF = PAGE_SIZE * HEAD_DIM    # byte offset of the scales inside a page


@cute.jit
def active_entries(width: Int32, mActiveWidth: cute.Tensor, has_active_width: Int32) -> Int32:
    """The active width: `width`, or active_width[0] from the device buffer (never a host sync).
    It is in entries, the decode-metadata helper's unit, so it is not divided by the ratio."""
    active = width
    if has_active_width != 0:
        active = cutlass.min(width, cutlass.max(mActiveWidth[0], 0))
    return active


@cute.jit
def load_page_rows(mKV: cute.Tensor, blk: Int32, t_lo: Int32, tig: Int32, rK: cute.Tensor, rS: cute.Tensor,
                   memory_order: cutlass.Constexpr) -> Int32:
    """Start the loads of rows t_lo and t_lo + 8 of page blk into rK (this lane's 8 words of each,
    as mma.sync A fragments) and their scales into rS. Nothing is read for an entry outside
    [0, blocks): returns 0 then (the page is to score -inf), else 1; one unsigned compare also
    catches the negative entries.

    memory_order=False: the fragment permutation of fp8_mma (bytes [64 h + 16 tig, +16), two
    16-byte loads). memory_order=True: dims in memory order, as a shared-memory wgmma operand
    has them (the same K order gives the same fp8 tensor-core sums): word 2 s + h of k-step s is
    bytes [32 s + 16 h + 4 tig, +4)."""
    ok = Int32(Uint32(blk) < Uint32(cutlass.max(mKV.shape[0], 0)))
    if ok != 0:
        page = mKV.iterator.toint() + Int64(blk) * Int64(mKV.stride[0])
        for r in cutlass.range_constexpr(2):
            if const_expr(memory_order):
                row_addr = page + (t_lo + 8 * r) * HEAD_DIM + tig * 4
                for w in cutlass.range_constexpr(8):
                    rK[r, w] = load_u32(row_addr + 32 * (w // 2) + 16 * (w % 2))
            else:
                row_addr = page + (t_lo + 8 * r) * HEAD_DIM + tig * 16
                for h in cutlass.range_constexpr(2):
                    load_16b(row_addr + h * 64, cute.local_tile(rK[r, None], (4,), (h,)))
            rS[r] = load_f32(page + SCALE_OFF + (t_lo + 8 * r) * 4)
    return ok
