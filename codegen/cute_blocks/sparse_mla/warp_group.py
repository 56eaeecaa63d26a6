"""The 8-head fp8_ds_mla decode split as a warp group on mma.sync: the form of the calls whose rows
fill the SMs (codegen.tiling.WARP_GROUP_MIN_ROWS; docs/notes/mma-forms.md, "A warp-group form on
mma.sync"; benchmarks/ceilings/h8_warp_mma.cu is the standalone CUDA probe it came from).

A CTA is 4 warps and one split; each step takes 16 tokens. Warp h owns NoPE bytes [128 h, + 128)
and RoPE dims [16 h, + 16) of every record, i.e. one 128-dim scale block:
  S^T (16 tokens x 8 heads) = K Q^T by mma.sync m16n8k16: thread (g, q) loads its bytes of tokens
    g and g + 8 into registers one step ahead and converts them e4m3 -> fp16 (exact) into its A
    fragments; the contraction runs in a permuted dim order in which those bytes are its
    fragment, and Q (B) is stored in it. The block scale multiplies the S^T sums.
  The 4 warps' partial S^T meet in shared memory (one barrier a step); every warp runs the same
    online softmax (the max moves only when a score passes it by more than 8, log2).
  O^T (dims x 8 heads) += V^T P^T: the step's fp16 K fragments transposed by movmatrix are A,
    P^T (the S^T accumulator times the token's block scale, packed, transposed) is B.
The partial o is staged in shared memory and written [row, split, head, dim] in 16-byte chunks."""
import cutlass
import cutlass.cute as cute
from cutlass import Float16, Float32, Int32, Int64, Uint32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from .gather import GatherRows, ld_global_nc
from .kv_layout import Fp8DsMlaRecord
from .softmax import xor_allreduce

RECORD = Fp8DsMlaRecord(d_nope=512, d_rope=64)   # the records this form reads (V3.2's 656 bytes)
NW = RECORD.n_scales         # warps a CTA, each one scale block (128 dims) of the NoPE bytes
STEP = 16                    # tokens a step
NJ = RECORD.d_nope // NW // 16   # NoPE k-steps (and O^T m-tiles) of a warp: 8
CTAS_PER_SM = 4              # 128 registers a thread (no spill); codegen.tiling plans with it


def _asm(ret, args, text, cons, loc, ip, side=False):
    return llvm.inline_asm(ret, [a.ir_value(loc=loc, ip=ip) for a in args], text, cons,
                           has_side_effects=side, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def mma_16816(a0, a1, a2, a3, b0, b1, c, kind: str = "f16", *, loc=None, ip=None):
    """c (4 f32) += A (16 x 16) . B (16 x 8), f16 or bf16 operands, PTX fragment order."""
    res = _asm(llvm.StructType.get_literal([T.f32()] * 4),
               [Uint32(a0), Uint32(a1), Uint32(a2), Uint32(a3), Uint32(b0), Uint32(b1)] + [Float32(x) for x in c],
               f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32 "
               "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
               "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", loc, ip)
    return [Float32(llvm.extractvalue(T.f32(), res, [i], loc=loc, ip=ip)) for i in range(4)]


@dsl_user_op
def ld_shared_f32(addr, *, loc=None, ip=None) -> Float32:
    """One f32 from a shared-memory byte address, as an opaque read (ordered after the stores
    before it, never replaced by the stored register)."""
    return Float32(_asm(T.f32(), [Int32(addr)], "ld.shared.f32 $0, [$1];", "=f,r", loc, ip, side=True))


@dsl_user_op
def movmatrix_t(x, *, loc=None, ip=None) -> Uint32:
    """The warp's 8 x 8 b16 matrix transposed (thread g, q holds row g, columns 2q, 2q + 1)."""
    return Uint32(_asm(T.i32(), [Uint32(x)], "movmatrix.sync.aligned.m8n8.trans.b16 $0, $1;", "=r,r", loc, ip,
                       side=True))


@dsl_user_op
def e4m3x4_to_f16(w, *, loc=None, ip=None):
    """4 e4m3 bytes -> (f16x2 of bytes 0, 1; f16x2 of bytes 2, 3), exact."""
    res = _asm(llvm.StructType.get_literal([T.i32(), T.i32()]), [Uint32(w)],
               "{ .reg .b16 l, h; mov.b32 {l, h}, $2; cvt.rn.f16x2.e4m3x2 $0, l; cvt.rn.f16x2.e4m3x2 $1, h; }",
               "=r,=r,r", loc, ip)
    return (Uint32(llvm.extractvalue(T.i32(), res, [0], loc=loc, ip=ip)),
            Uint32(llvm.extractvalue(T.i32(), res, [1], loc=loc, ip=ip)))


@dsl_user_op
def pack_f16x2(lo, hi, *, loc=None, ip=None) -> Uint32:
    """(lo, hi) rounded to fp16, lo in the low half."""
    return Uint32(_asm(T.i32(), [Float32(hi), Float32(lo)], "cvt.rn.f16x2.f32 $0, $1, $2;", "=r,f,f", loc, ip))


@dsl_user_op
def bf16x2_to_f16x2(w, *, loc=None, ip=None) -> Uint32:
    """Two bf16 -> two fp16 (via f32)."""
    return Uint32(_asm(T.i32(), [Uint32(w)],
                       "{ .reg .b32 a, b; .reg .b16 l, h; mov.b32 {l, h}, $1; mov.b32 a, {0, l}; mov.b32 b, {0, h};"
                       " cvt.rn.f16x2.f32 $0, b, a; }", "=r,r", loc, ip))


class WarpGroupSplit(GatherRows):
    """The decode split (SplitKernel's arguments and grid) in the warp-group form."""

    def __init__(self, num_heads: int = 8, page_size: int = 64):
        assert num_heads == 8
        self.num_heads = num_heads
        self.page_size = page_size
        self.tile_tokens = STEP
        self.num_threads = 32 * NW

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mKV: cute.Tensor, mIdx: cute.Tensor, mLen: cute.Tensor, mPartO: cute.Tensor,
                 mPartLse: cute.Tensor, sm_scale_log2: Float32, tokens_per_split: Int32, stream):
        grid = (cute.size(mPartO.shape[1]), 1, cute.size(mQ.shape[0]))
        self.kernel(mQ, mKV, mIdx, mLen, mPartO, mPartLse, sm_scale_log2, tokens_per_split).launch(
            grid=grid, block=[self.num_threads, 1, 1], stream=stream, use_pdl=True,
            min_blocks_per_mp=CTAS_PER_SM, preferred_smem_carveout=100)

    @cute.jit
    def load_record(self, mKV, slot, h, q, rec: cute.Tensor, u: cutlass.Constexpr, n_slots) -> Int32:
        """This thread's bytes of one record into rec[:, u] (11 words): NoPE [128 h + 16 q + 64 i,
        + 16) for i = 0, 1 (words 0-7), RoPE dims [16 h + 4 q, + 4) (words 8, 9), the block scale
        (10). A masked slot leaves zeros; returns 1 if the slot is live."""
        for k in cutlass.range_constexpr(11):
            rec[k, u] = Uint32(0)
        live = self.live_slot(slot, n_slots)
        if live:
            base = self.live_row_address(mKV, slot, RECORD.bytes)
            for i in cutlass.range_constexpr(2):
                w = ld_global_nc(base + 128 * h + 16 * q + 64 * i, 4)
                for k in cutlass.range_constexpr(4):
                    rec[4 * i + k, u] = w[k]
            rope = ld_global_nc(base + RECORD.rope_off + 32 * h + 8 * q, 2)
            rec[8, u] = rope[0]
            rec[9, u] = rope[1]
            rec[10, u] = ld_global_nc(base + RECORD.scale_off + 4 * h, 1)[0]
        return Int32(1) if live else Int32(0)

    @cute.jit
    def step(self, st, n_steps, rec, ok, nxt, mKV, idx_row, tok_begin, tok_end, n_slots, h, q, g, lane, tidx, sQ,
             sX, sSg, o, st_ml, k16, sm_scale_log2):
        """One 16-token step: S^T, the exchange, the online softmax, O^T; the next step's
        records are loaded into rec on the way."""
        cv0 = ok[0] != 0
        cv1 = ok[1] != 0
        # ---- this step's record words become fp16 K fragments, the RoPE product and the block
        # scales in shared memory; then the next step's records are loaded into the same
        # registers, in flight through the rest of this step. (No record word may be read after
        # those loads: a value kept in a register past them becomes a loop-carried copy that
        # waits on the next record in the middle of the step.)
        for j in cutlass.range_constexpr(NJ):
            k16[j, 0], k16[j, 2] = e4m3x4_to_f16(rec[j, 0])
            k16[j, 1], k16[j, 3] = e4m3x4_to_f16(rec[j, 1])
        cr = mma_16816(rec[8, 0], rec[8, 1], rec[9, 0], rec[9, 1], sQ[0, lane, NJ, h], sQ[1, lane, NJ, h],
                       [Float32(0.0)] * 4, kind="bf16")
        sSg[0, tidx] = llvm_bitcast_f32(rec[10, 0])
        sSg[1, tidx] = llvm_bitcast_f32(rec[10, 1])
        if st + 1 < n_steps:
            for u in cutlass.range_constexpr(2):
                ok[u] = self.load_record(mKV, nxt[u], h, q, rec, u, n_slots)
            for u in cutlass.range_constexpr(2):
                nxt[u] = self.index_at_row(idx_row, tok_begin + (st + 2) * STEP + g + 8 * u, tok_end)
        # ---- S^T partial over this warp's block: two accumulation chains, then the scale ------
        ca0 = [Float32(0.0)] * 4
        ca1 = [Float32(0.0)] * 4
        for j in cutlass.range_constexpr(NJ):
            if const_expr(j % 2 == 0):
                ca0 = mma_16816(k16[j, 0], k16[j, 1], k16[j, 2], k16[j, 3], sQ[0, lane, j, h], sQ[1, lane, j, h], ca0)
            else:
                ca1 = mma_16816(k16[j, 0], k16[j, 1], k16[j, 2], k16[j, 3], sQ[0, lane, j, h], sQ[1, lane, j, h], ca1)
        sg_addr = sSg.iterator.toint() + 4 * 2 * tidx
        sgA = ld_shared_f32(sg_addr)
        sgB = ld_shared_f32(sg_addr + 4)
        # ---- the 4 warps' partial S^T meet ----------------------------------------------------
        buf = st % 2
        for e in cutlass.range_constexpr(4):
            sX[e, lane, h, buf] = cr[e] + (sgA if e < 2 else sgB) * (ca0[e] + ca1[e])
        cute.arch.sync_threads()
        s = [Float32(0.0)] * 4
        for e in cutlass.range_constexpr(4):
            acc = sX[e, lane, 0, buf]
            for w in cutlass.range_constexpr(1, NW):
                acc = acc + sX[e, lane, w, buf]
            s[e] = acc * sm_scale_log2
        s[0] = s[0] if cv0 else -Float32.inf
        s[1] = s[1] if cv0 else -Float32.inf
        s[2] = s[2] if cv1 else -Float32.inf
        s[3] = s[3] if cv1 else -Float32.inf
        # ---- online softmax: heads 2q (s0, s2), 2q + 1 (s1, s3); tokens g (s0, s1), g + 8 -----
        mx0 = xor_allreduce(cute.arch.fmax(s[0], s[2]), True, 2, 3)
        mx1 = xor_allreduce(cute.arch.fmax(s[1], s[3]), True, 2, 3)
        m0 = st_ml[0]
        m1 = st_ml[1]
        # (m = -inf: any finite score moves it; both -inf: nothing to move)
        up0 = mx0 > m0 + Float32(8.0)
        up1 = mx1 > m1 + Float32(8.0)
        mn0 = mx0 if up0 else m0
        mn1 = mx1 if up1 else m1
        ms0 = Float32(0.0) if mn0 == -Float32.inf else mn0
        ms1 = Float32(0.0) if mn1 == -Float32.inf else mn1
        cr0 = cute.math.exp2(m0 - ms0, fastmath=True) if up0 else Float32(1.0)
        cr1 = cute.math.exp2(m1 - ms1, fastmath=True) if up1 else Float32(1.0)
        st_ml[0] = mn0
        st_ml[1] = mn1
        p0 = cute.math.exp2(s[0] - ms0, fastmath=True)
        p1 = cute.math.exp2(s[1] - ms1, fastmath=True)
        p2 = cute.math.exp2(s[2] - ms0, fastmath=True)
        p3 = cute.math.exp2(s[3] - ms1, fastmath=True)
        st_ml[2] = st_ml[2] * cr0 + p0 + p2
        st_ml[3] = st_ml[3] * cr1 + p1 + p3
        if cute.arch.vote_any_sync(up0 | up1):
            for j in cutlass.range_constexpr(NJ):
                o[j, 0] = o[j, 0] * cr0
                o[j, 1] = o[j, 1] * cr1
                o[j, 2] = o[j, 2] * cr0
                o[j, 3] = o[j, 3] * cr1
        pb0 = movmatrix_t(pack_f16x2(p0 * sgA, p1 * sgA))
        pb1 = movmatrix_t(pack_f16x2(p2 * sgB, p3 * sgB))
        # ---- O^T += V^T P^T ---------------------------------------------------------------
        for j in cutlass.range_constexpr(NJ):
            oj = mma_16816(movmatrix_t(k16[j, 0]), movmatrix_t(k16[j, 2]), movmatrix_t(k16[j, 1]),
                           movmatrix_t(k16[j, 3]), pb0, pb1, [o[j, 0], o[j, 1], o[j, 2], o[j, 3]])
            for e in cutlass.range_constexpr(4):
                o[j, e] = oj[e]

    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mKV: cute.Tensor, mIdx: cute.Tensor, mLen: cute.Tensor, mPartO: cute.Tensor,
               mPartLse: cute.Tensor, sm_scale_log2: Float32, tokens_per_split: Int32):
        cute.arch.griddepcontrol_wait()
        cute.arch.griddepcontrol_launch_dependents()
        tidx, _, _ = cute.arch.thread_idx()
        split, _, row = cute.arch.block_idx()
        h = tidx // 32
        lane = tidx % 32
        g = lane // 4
        q = lane % 4

        smem = cutlass.utils.SmemAllocator()
        sQ = smem.allocate_tensor(Uint32, cute.make_layout((2, 32, NJ + 1, NW)), byte_alignment=16)
        sX = smem.allocate_tensor(Float32, cute.make_layout((4, 32, NW, 2)), byte_alignment=16)
        sO = smem.allocate_tensor(Float16, cute.make_layout((512, 8), stride=(1, 512)), byte_alignment=16)
        sSg = smem.allocate_tensor(Float32, cute.make_layout((2, 32 * NW)), byte_alignment=16)  # [token, thread]

        width = mIdx.shape[1]
        tok_begin = split * tokens_per_split
        tok_end = cutlass.min(cutlass.min(tok_begin + tokens_per_split, width), cutlass.max(mLen[row], 0))
        n_steps = (cutlass.max(tok_end - tok_begin, 0) + (STEP - 1)) // STEP
        n_slots = self.cache_slots(mKV)
        idx_row = self.index_row(mIdx, row)

        # ---- the first step's records (they travel while Q is converted); the second's indices ---
        rec = cute.make_rmem_tensor((11, 2), Uint32)    # words of token g, g + 8
        ok = cute.make_rmem_tensor((2,), Int32)         # this step's tokens are live
        nxt = cute.make_rmem_tensor((2,), Int32)        # slots of the next step's tokens g, g + 8
        for u in cutlass.range_constexpr(2):
            ok[u] = self.load_record(mKV, self.index_at_row(idx_row, tok_begin + g + 8 * u, tok_end), h, q, rec, u,
                                     n_slots)
        for u in cutlass.range_constexpr(2):
            nxt[u] = self.index_at_row(idx_row, tok_begin + STEP + g + 8 * u, tok_end)

        # ---- Q fragments: NoPE k-step j = dims d0 .. d0 + 3 of head g as fp16, RoPE as bf16 -----
        for j in cutlass.range_constexpr(NJ + 1):
            d0 = (128 * h + 16 * q + 64 * (j // 4) + 4 * (j % 4)) if j < NJ else (RECORD.d_nope + 16 * h + 4 * q)
            src = cute.make_tensor(cute.make_ptr(Uint32, mQ[row, g, None].iterator.toint() + 2 * d0,
                                                 cute.AddressSpace.gmem, assumed_align=8), cute.make_layout((2,)))
            w0 = src[0]
            w1 = src[1]
            if const_expr(j < NJ):
                w0 = bf16x2_to_f16x2(w0)
                w1 = bf16x2_to_f16x2(w1)
            sQ[0, lane, j, h] = w0
            sQ[1, lane, j, h] = w1
        cute.arch.sync_warp()

        o = cute.make_rmem_tensor((NJ, 4), Float32)
        o.fill(0.0)
        st_ml = cute.make_rmem_tensor((4,), Float32)    # m (heads 2q, 2q + 1), l (the same)
        st_ml[0] = -Float32.inf
        st_ml[1] = -Float32.inf
        st_ml[2] = Float32(0.0)
        st_ml[3] = Float32(0.0)
        k16 = cute.make_rmem_tensor((NJ, 4), Uint32)

        for st in cutlass.range(n_steps, unroll=1):
            self.step(st, n_steps, rec, ok, nxt, mKV, idx_row, tok_begin, tok_end, n_slots, h, q, g, lane, tidx, sQ,
                      sX, sSg, o, st_ml, k16, sm_scale_log2)

        # ---- epilogue: row sums over the lane groups, the normalised partial through sO ----------
        l0 = xor_allreduce(st_ml[2], False, 2, 3)
        l1 = xor_allreduce(st_ml[3], False, 2, 3)
        il0 = cute.arch.rcp_approx(l0) if l0 > Float32(0.0) else Float32(0.0)
        il1 = cute.arch.rcp_approx(l1) if l1 > Float32(0.0) else Float32(0.0)
        for j in cutlass.range_constexpr(NJ):
            # O^T row r of m-tile j is dim 128 h + 64 (j / 4) + 4 (j % 4) + 16 (r % 8 / 2) + (r >= 8 ? 2 : 0) + r % 2
            for half in cutlass.range_constexpr(2):
                r = g + 8 * half
                dim = 128 * h + 64 * (j // 4) + 4 * (j % 4) + 16 * ((r % 8) // 2) + 2 * half + r % 2
                sO[dim, 2 * q] = Float16(o[j, 2 * half] * il0)
                sO[dim, 2 * q + 1] = Float16(o[j, 2 * half + 1] * il1)
        cute.arch.sync_threads()
        dst = mPartO[row, split, None, None]
        for c in cutlass.range_constexpr(8 * 512 // 8 // (32 * NW)):
            chunk = tidx + 32 * NW * c
            hd = chunk // 64
            d8 = chunk % 64
            cute.autovec_copy(cute.local_tile(sO[None, hd], (8,), (d8,)), cute.local_tile(dst[hd, None], (8,), (d8,)))
        if h == 0 and g == 0:
            mPartLse[row, split, 2 * q] = st_ml[0] + cute.math.log2(l0, fastmath=True) if l0 > Float32(0.0) else -Float32.inf
            mPartLse[row, split, 2 * q + 1] = (st_ml[1] + cute.math.log2(l1, fastmath=True) if l1 > Float32(0.0)
                                               else -Float32.inf)


@dsl_user_op
def llvm_bitcast_f32(x, *, loc=None, ip=None) -> Float32:
    """The 32 bits of x read as an f32 (a record's fp32 scale loaded as a word)."""
    return Float32(llvm.bitcast(T.f32(), Uint32(x).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))
