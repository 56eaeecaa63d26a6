"""Block-wide scans the top-k and the extend's order pass share."""
import cutlass
import cutlass.cute as cute
from cutlass import Int32, const_expr


@cute.jit
def block_exclusive_sum(v: Int32, sSums, warp: Int32, lane: Int32, num_warps: cutlass.Constexpr,
                        reused: cutlass.Constexpr) -> Int32:
    """Exclusive prefix sum of v over the CTA in thread order. sSums: num_warps Int32 of shared
    memory for the warps' totals; reused: an earlier scan may still be reading them, so the CTA
    synchronizes before they are written."""
    incl = v
    for s in cutlass.range_constexpr(5):
        o = cute.arch.shuffle_sync_up(incl, offset=1 << s)
        if lane >= (1 << s):
            incl = incl + o
    if const_expr(reused):
        cute.arch.sync_threads()
    if lane == 31:
        sSums[warp] = incl
    cute.arch.sync_threads()
    before = Int32(0)
    for w in cutlass.range_constexpr(num_warps):
        if w < warp:
            before = before + sSums[w]
    return before + incl - v
