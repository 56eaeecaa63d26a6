"""Lightning indexer logits: the part both MMA forms share.

    logits[r, t] = k_scale[t] * sum_h weights[r, h] * relu(q[r, h] . k[t]),   -inf past the row.

A kernel class composes one K source (PagedLogits or ContiguousLogits: the entry point's
arguments and their fakes) with one MMA form (WgmmaLogits in logits_wgmma.py,
WarpMmaLogits in logits_warp.py: the launch and the device code) on top of LogitsKernel, which
holds the config. The generated module sets the config through LogitsKernel.__init__; the
kernels branch on it with const_expr, so each compiles to only the code of its spec.

Both K sources hand the form one argument list, the same for every spec, where what the
source lacks is None (no kernel parameter, no code):
    mQ, mW, mKV, mBlockTable, mLengths, mActiveWidth, mKVScale, mStarts, mEnds, mLogits,
    rows_per_req, has_active_width, per_cta
All address math is 64-bit: caches may exceed 2^31 bytes."""
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint8

from .fp8_mma import HEAD_DIM, Fp8Scorer
from .k_pages import PAGE_SIZE

TOKENS_PER_WARP = 16            # the M of a warp's share of a page


class LogitsKernel:
    """Config of a logits kernel. num_heads: index heads (a multiple of 8); compress_ratio: tokens
    per cache entry (paged); rows_per_unit: query rows of one request scored per staged page
    (wgmma form, MTP); warps: per CTA (a page is 16 tokens per warp); min_ctas: the occupancy
    asked of ptxas (q and the accumulators dominate the registers: enough CTAs per SM keep
    enough pages in flight to cover HBM latency)."""

    def __init__(self, *, num_heads: int, compress_ratio: int, rows_per_unit: int, warps: int, min_ctas: int):
        self.num_heads = num_heads
        self.compress_ratio = compress_ratio
        self.rows_per_unit = rows_per_unit
        self.warps = warps
        self.num_threads = 32 * warps
        self.min_ctas = min_ctas
        self.scorer = Fp8Scorer(num_heads)
        assert warps * TOKENS_PER_WARP == PAGE_SIZE and num_heads % 8 == 0


class PagedLogits:
    """K in [blocks, 64, 132] byte pages (DeepGEMM's layout: 64 rows of 128 e4m3, then 64 fp32
    scales) reached through block_table[row // rows_per_req]. Row r holds
    floor(lengths[r] / compress_ratio) entries (lengths count tokens), clipped to the active
    width; positions from there to the active width get -inf, columns past it are not written.
    A page whose block-table entry lies outside [0, blocks) is never read: its entries get -inf."""

    paged = True

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,          # [rows, Hi, 128] u8 (e4m3 bits)
        mW: cute.Tensor,          # [rows, Hi] f32
        mKV: cute.Tensor,         # [blocks, 64, 132] u8, page stride >= 8448 bytes
        mBlockTable: cute.Tensor,  # [requests, max_pages] i32
        mLengths: cute.Tensor,    # [rows] i32, tokens (entries = lengths // compress_ratio)
        mActiveWidth: cute.Tensor,  # [1] i32: active width in entries (used when has_active_width != 0)
        mLogits: cute.Tensor,     # [rows, width] f32, row stride >= width
        rows_per_req: Int32,      # query rows per request (MTP next_n)
        has_active_width: Int32,
        per_cta: Int32,           # the planner's work per CTA (see the form's launch)
        stream,
    ):
        self.launch(mQ, mW, mKV, mBlockTable, mLengths, mActiveWidth, None, None, None, mLogits, rows_per_req,
                    has_active_width, per_cta, stream)

    def make_fakes(self):
        rows, width = cute.sym_int32(), cute.sym_int32()
        q, w = _q_w_fakes(self.num_heads, rows)
        blocks = cute.sym_int32()
        kv = cute.runtime.make_fake_tensor(Uint8, (blocks, PAGE_SIZE, HEAD_DIM + 4),
                                           (cute.sym_int64(divisibility=16), HEAD_DIM + 4, 1), assumed_align=16)
        bt = cute.runtime.make_fake_tensor(Int32, (cute.sym_int32(), cute.sym_int32()), (cute.sym_int64(), 1),
                                           assumed_align=4)
        lengths = cute.runtime.make_fake_compact_tensor(Int32, (rows,), assumed_align=4)
        active_width = cute.runtime.make_fake_compact_tensor(Int32, (cute.sym_int32(),), assumed_align=4)
        logits = _logits_fake(rows, width)
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        return (q, w, kv, bt, lengths, active_width, logits, Int32(1), Int32(0), Int32(1), stream)


class ContiguousLogits:
    """K gathered and contiguous: kv [n, 128] e4m3 and kv_scales [n] fp32. Row r is valid on
    [starts[r], ends[r]) (clamped to n); every other column of the row gets -inf."""

    paged = False

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,          # [rows, Hi, 128] u8 (e4m3 bits)
        mW: cute.Tensor,          # [rows, Hi] f32
        mKV: cute.Tensor,         # [n, 128] u8 (e4m3 bits)
        mKVScale: cute.Tensor,    # [n] f32
        mStarts: cute.Tensor,     # [rows] i32
        mEnds: cute.Tensor,       # [rows] i32
        mLogits: cute.Tensor,     # [rows, width] f32, row stride >= width
        per_cta: Int32,           # the planner's work per CTA (see the form's launch)
        stream,
    ):
        self.launch(mQ, mW, mKV, None, None, None, mKVScale, mStarts, mEnds, mLogits, None, None, per_cta, stream)

    def make_fakes(self):
        rows, width = cute.sym_int32(), cute.sym_int32()
        q, w = _q_w_fakes(self.num_heads, rows)
        n = cute.sym_int32()
        kv = cute.runtime.make_fake_compact_tensor(Uint8, (n, HEAD_DIM), stride_order=(1, 0), assumed_align=16)
        kv_scale = cute.runtime.make_fake_compact_tensor(Float32, (n,), assumed_align=4)
        starts = cute.runtime.make_fake_compact_tensor(Int32, (rows,), assumed_align=4)
        ends = cute.runtime.make_fake_compact_tensor(Int32, (rows,), assumed_align=4)
        logits = _logits_fake(rows, width)
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        return (q, w, kv, kv_scale, starts, ends, logits, Int32(1), stream)


def _q_w_fakes(num_heads: int, rows):
    q = cute.runtime.make_fake_compact_tensor(Uint8, (rows, num_heads, HEAD_DIM), stride_order=(2, 1, 0),
                                              assumed_align=16)
    w = cute.runtime.make_fake_compact_tensor(Float32, (rows, num_heads), stride_order=(1, 0), assumed_align=16)
    return q, w


def _logits_fake(rows, width):
    return cute.runtime.make_fake_tensor(Float32, (rows, width), (cute.sym_int64(), 1), assumed_align=4)
