"""Online softmax in base 2 over MMA accumulator fragments: lane reductions, the per-tile max
step, and the per-head finish (1 / sum, lse, attention sink)."""
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

LOG2_E = 1.4426950408889634
LN_2 = 0.6931471805599453


@cute.jit
def xor_allreduce(val: Float32, is_max: cutlass.Constexpr, lo: cutlass.Constexpr, n: cutlass.Constexpr) -> Float32:
    """Reduce over the lanes whose ids differ only in bits lo .. lo + n - 1: an MMA quad
    (lo 0, n 2) holds one accumulator row; lanes 4 apart (lo 2, n 3) hold one column."""
    for i in cutlass.range_constexpr(n):
        other = cute.arch.shuffle_sync_bfly(val, offset=1 << (lo + n - 1 - i))
        if const_expr(is_max):
            val = cute.arch.fmax(val, other)
        else:
            val = val + other
    return val


@cute.jit
def quad_allreduce(val: Float32, is_max: cutlass.Constexpr) -> Float32:
    return xor_allreduce(val, is_max, 0, 2)


@cute.jit
def lanes_allreduce(val: Float32, is_max: cutlass.Constexpr) -> Float32:
    return xor_allreduce(val, is_max, 2, 3)


@cute.jit
def max_step(old_max: Float32, new_max: Float32, sm_scale_log2: Float32):
    """One online-softmax step of a row: (new max * scale, 2^((old - new max) * scale)), the
    offset its exponents subtract and the factor that rescales what was accumulated; offset 0
    while the row has seen only masked tokens (-inf), so their 2^(-inf) stays 0."""
    max_scaled = (new_max * sm_scale_log2) if new_max != -Float32.inf else Float32(0.0)
    corr = cute.math.exp2(old_max * sm_scale_log2 - max_scaled, fastmath=True)
    return max_scaled, corr


@cute.jit
def finish_head(total: Float32, mx: Float32, sm_scale_log2: Float32):
    """(1 / sum, base-2 lse) of one head from its sum of 2^(s - max) and raw max; (0, -inf)
    when nothing was attended."""
    inv = Float32(0.0)
    lse = -Float32.inf
    if total > 0.0:
        inv = cute.arch.rcp_approx(total)
        lse = cute.math.log2(total, fastmath=True) + mx * sm_scale_log2
    return inv, lse


@cute.jit
def sink_scale(inv: Float32, lse: Float32, has_sink: Int32, mSink: cute.Tensor, head: Int32) -> Float32:
    """Fold the attention sink into a head's 1 / sum: times exp(lse) / (exp(lse) + exp(sink)),
    lse in base 2; a head that attended nothing (inv 0) stays 0."""
    if has_sink != 0:
        if inv > 0.0:
            inv = inv / (1.0 + cute.math.exp(mSink[head] - lse * LN_2, fastmath=False))
    return inv


@cute.jit
def head_out_scale(total: Float32, mx: Float32, sm_scale_log2: Float32, sink, head: Int32):
    """(factor for the head's o, its lse as written): finish_head, then for extend's out
    (sink = (has_sink, mSink, lse_natural); None for a decode split's base-2 partial) the
    attention sink folded in and the lse in the caller's base."""
    inv, lse = finish_head(total, mx, sm_scale_log2)
    if const_expr(sink is not None):
        inv = sink_scale(inv, lse, sink[0], sink[1], head)
        lse = lse * LN_2 if sink[2] != 0 else lse
    return inv, lse
