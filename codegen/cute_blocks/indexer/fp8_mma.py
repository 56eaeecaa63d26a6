"""fp8 (e4m3) scoring of the lightning indexer: warp mma.sync (sm_89 on, the sm_120a form) and
wgmma (sm_90a), raw 16-byte loads, cp.async, shared-memory matrix descriptors.

Written once here and imported by the generated indexer modules (logits, fused score-and-select).
Free functions need no configuration; `Fp8Scorer(num_heads)` holds the head count the scoring
loops unroll over (a Python int: every loop over heads is unrolled at trace time)."""
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

HEAD_DIM = 128                  # the indexer's head dim (IndexerLogitsSpec allows only 128)


# ---- fp8 warp MMA and raw loads ---------------------------
# The indexer keeps every operand in registers: K rows are read with 16-byte loads straight into
# the A fragments of mma.sync.m16n8k32 (e4m3), q into the B fragments. Both operands are K-major,
# which is the only layout fp8 mma.sync takes. The 128 dims are permuted identically for q and k
# (a dot product does not care about the order), so each thread's fragments come from two
# contiguous 16-byte pieces of its row:
#   thread (g = lane / 4, t = lane % 4) reads bytes [64 h + 16 t, +16) for h in {0, 1},
#   i.e. 8 u32 words w[0..7]; k-step s (0..3) uses words 2s ("low" k) and 2s + 1 ("high" k).
# A quad (4 lanes) therefore reads 64 contiguous bytes of a row per load: whole 32-byte sectors.


@dsl_user_op
def mma_e4m3_m16n8k32(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, *, loc=None, ip=None):
    """(d0..d3) = A(16x32 e4m3) . B(32x8 e4m3) + C, f32 accumulate; PTX fragment register order.

    Inline PTX: warp mma.sync e4m3 exists from sm_89 on, so one instruction serves sm_90a and
    sm_120a alike (wgmma would be Hopper-only)."""
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.f32(), T.f32(), T.f32(), T.f32()]),
        [Uint32(a0).ir_value(loc=loc, ip=ip), Uint32(a1).ir_value(loc=loc, ip=ip),
         Uint32(a2).ir_value(loc=loc, ip=ip), Uint32(a3).ir_value(loc=loc, ip=ip),
         Uint32(b0).ir_value(loc=loc, ip=ip), Uint32(b1).ir_value(loc=loc, ip=ip),
         Float32(c0).ir_value(loc=loc, ip=ip), Float32(c1).ir_value(loc=loc, ip=ip),
         Float32(c2).ir_value(loc=loc, ip=ip), Float32(c3).ir_value(loc=loc, ip=ip)],
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
        "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
        "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f",
        has_side_effects=False,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )
    return (Float32(llvm.extractvalue(T.f32(), res, [0], loc=loc, ip=ip)),
            Float32(llvm.extractvalue(T.f32(), res, [1], loc=loc, ip=ip)),
            Float32(llvm.extractvalue(T.f32(), res, [2], loc=loc, ip=ip)),
            Float32(llvm.extractvalue(T.f32(), res, [3], loc=loc, ip=ip)))


@cute.jit
def load_16b(addr: Int64, dst: cute.Tensor):
    """One 16-byte global load of 4 u32 words into a register slice (dst has 4 elements)."""
    src = cute.make_tensor(cute.make_ptr(Uint32, addr, cute.AddressSpace.gmem, assumed_align=16),
                           cute.make_layout((4,)))
    cute.autovec_copy(src, dst)


@cute.jit
def load_u32(addr: Int64) -> Uint32:
    src = cute.make_tensor(cute.make_ptr(Uint32, addr, cute.AddressSpace.gmem, assumed_align=4),
                           cute.make_layout((1,)))
    return src[0]


@cute.jit
def load_f32(addr: Int64) -> Float32:
    src = cute.make_tensor(cute.make_ptr(Float32, addr, cute.AddressSpace.gmem, assumed_align=4),
                           cute.make_layout((1,)))
    return src[0]


@cute.jit
def store_f32(addr: Int64, v: Float32):
    dst = cute.make_tensor(cute.make_ptr(Float32, addr, cute.AddressSpace.gmem, assumed_align=4),
                           cute.make_layout((1,)))
    dst[0] = v


@cute.jit
def quad_sum(v: Float32) -> Float32:
    """Sum over the 4 lanes of an MMA quad (they hold the same accumulator rows)."""
    v = v + cute.arch.shuffle_sync_bfly(v, offset=1)
    v = v + cute.arch.shuffle_sync_bfly(v, offset=2)
    return v


# ---- Hopper: wgmma (QGMMA) with q in shared memory -------------------------------------------
# On sm_90a, fp8 mma.sync is not native: ptxas lowers each m16n8k32 to F2FP conversions of both
# operands plus two HMMA.16816, which made the scoring issue-bound (~1100 cycles per 64-token page
# per SM against ~500 for its HBM bytes). wgmma m64nHk32 e4m3 runs it on the fp8 tensor cores,
# D = 64 tokens x Hi heads, B = q[row] in shared memory. A, the page's 64 K rows, is either a
# shared-memory tile in the 128-byte swizzle (logits kernel) or registers loaded from global
# memory (fused kernel: word 2 s + h of k-step s is bytes [32 s + 16 h + 4 tig, +4) of the row).
# Both keep the dims in memory order, so both paths feed the tensor cores the same K order: the
# fp8 sums they accumulate are identical (the tensor cores' fp8 accumulation rounds differently
# for a different order, by up to ~1e-3 relative). B is K-major without swizzle: core matrices of
# 8 heads x 16 bytes stored as 128 contiguous bytes; 16-byte chunks along K 128 bytes apart (LBO),
# 8-head groups 1024 bytes apart (SBO).
WG_LBO = 128
WG_SBO = 1024


def _wgmma_asm(n: int) -> tuple[str, str]:
    """wgmma m64n{n}k32 e4m3 with A from registers: asm text and constraints (n / 2 accumulators)."""
    r = n // 2
    asm = ("{\n.reg .pred p;\nsetp.ne.b32 p, $%d, 0;\n" % (r + 5)
           + "wgmma.mma_async.sync.aligned.m64n%dk32.f32.e4m3.e4m3 {" % n
           + ", ".join("$%d" % i for i in range(r)) + "}, {"
           + ", ".join("$%d" % (r + i) for i in range(4)) + "}, $%d, p, 1, 1;\n}" % (r + 4))
    return asm, ",".join(["=f"] * r + ["r"] * 4 + ["l", "r"] + [str(i) for i in range(r)])


@dsl_user_op
def wgmma_e4m3_k32(acc, a0, a1, a2, a3, desc, scale_d, *, loc=None, ip=None):
    """acc (a list of N / 2 Float32) <- A(64x32, registers) . B(32xN, smem desc) + scale_d * acc."""
    asm, constraints = _wgmma_asm(2 * len(acc))
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.f32()] * len(acc)),
        [Uint32(a0).ir_value(loc=loc, ip=ip), Uint32(a1).ir_value(loc=loc, ip=ip),
         Uint32(a2).ir_value(loc=loc, ip=ip), Uint32(a3).ir_value(loc=loc, ip=ip),
         Int64(desc).ir_value(loc=loc, ip=ip), Int32(scale_d).ir_value(loc=loc, ip=ip)]
        + [Float32(x).ir_value(loc=loc, ip=ip) for x in acc],
        asm,
        constraints,
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )
    return [Float32(llvm.extractvalue(T.f32(), res, [i], loc=loc, ip=ip)) for i in range(len(acc))]


def _wgmma_ss_asm(n: int, accumulate: bool) -> tuple[str, str]:
    """wgmma m64n{n}k32 e4m3 with A and B from shared memory (two descriptors). The first step of
    a chain (accumulate=False) takes no accumulator inputs: scale-d is the immediate 0."""
    r = n // 2
    text = ("wgmma.mma_async.sync.aligned.m64n%dk32.f32.e4m3.e4m3 {" % n
            + ", ".join("$%d" % i for i in range(r)) + "}, $%d, $%d, %d, 1, 1;" % (r, r + 1, 1 if accumulate else 0))
    ties = [str(i) for i in range(r)] if accumulate else []
    return text, ",".join(["=f"] * r + ["l", "l"] + ties)


@dsl_user_op
def wgmma_ss_e4m3_k32(acc, a_desc, b_desc, accumulate: bool, *, loc=None, ip=None):
    """acc (N / 2 Float32) <- A(64x32, smem desc) . B(32xN, smem desc) (+ acc when accumulate)."""
    asm, constraints = _wgmma_ss_asm(2 * len(acc), accumulate)
    ins = [Int64(a_desc).ir_value(loc=loc, ip=ip), Int64(b_desc).ir_value(loc=loc, ip=ip)]
    if accumulate:
        ins += [Float32(x).ir_value(loc=loc, ip=ip) for x in acc]
    res = llvm.inline_asm(llvm.StructType.get_literal([T.f32()] * len(acc)), ins, asm, constraints,
                          has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)
    return [Float32(llvm.extractvalue(T.f32(), res, [i], loc=loc, ip=ip)) for i in range(len(acc))]


@dsl_user_op
def fence_f32(x, *, loc=None, ip=None) -> Float32:
    """Pin a wgmma accumulator after wait_group: no use may be scheduled above the wait."""
    return Float32(llvm.inline_asm(T.f32(), [Float32(x).ir_value(loc=loc, ip=ip)], "", "=f,0",
                                   has_side_effects=True, is_align_stack=False,
                                   asm_dialect=llvm.AsmDialect.AD_ATT))


@cute.jit
def smem_desc(addr: Int32) -> Int64:
    """sm90 shared-memory matrix descriptor: no swizzle, LBO = 128 B, SBO = 1024 B."""
    d = Int64((addr & 0x3FFFF) >> 4)
    d = d | (Int64(WG_LBO >> 4) << 16)
    d = d | (Int64(WG_SBO >> 4) << 32)
    return d


@cute.jit
def smem_desc_sw128(addr: Int32) -> Int64:
    """sm90 descriptor of a K-major tile with 128-byte rows and the 128-byte swizzle (8-row groups
    1024 bytes apart; the leading offset is unused): layout type 1 in bits 62-63."""
    d = Int64((addr & 0x3FFFF) >> 4)
    d = d | (Int64(1) << 16)
    d = d | (Int64(1024 >> 4) << 32)
    d = d | (Int64(1) << 62)
    return d


@cute.jit
def k_sw128(m, c):
    """Byte offset of 16-byte chunk c of token row m in a 64 x 128 B page tile stored in the
    wgmma 128-byte swizzle (chunk c of row m at c ^ (m % 8)): the tile is then a shared-memory A
    operand as it is, and the chunk stores of one warp cover all 32 banks."""
    return m * HEAD_DIM + ((c ^ (m & 7)) * 16)


@dsl_user_op
def cp_async_16(smem_addr: Int32, gmem_addr: Int64, *, loc=None, ip=None):
    """16 bytes global -> shared, asynchronous (L2 only: streamed data skips L1)."""
    llvm.inline_asm(None, [Int32(smem_addr).ir_value(loc=loc, ip=ip), Int64(gmem_addr).ir_value(loc=loc, ip=ip)],
                    "cp.async.cg.shared.global [$0], [$1], 16;", "r,l",
                    has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def cp_async_4(smem_addr: Int32, gmem_addr: Int64, *, loc=None, ip=None):
    """4 bytes global -> shared, asynchronous (through L1: .cg takes only 16-byte copies)."""
    llvm.inline_asm(None, [Int32(smem_addr).ir_value(loc=loc, ip=ip), Int64(gmem_addr).ir_value(loc=loc, ip=ip)],
                    "cp.async.ca.shared.global [$0], [$1], 4;", "r,l",
                    has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


class Fp8Scorer:
    """Scoring of one query row's heads against 16 (mma.sync) or 64 (wgmma) K tokens:
    sum_h w[h] relu(q_h . k). num_heads: the index heads (a multiple of 8)."""

    def __init__(self, num_heads: int):
        assert num_heads % 8 == 0
        self.num_heads = num_heads
        self.q_smem_words = num_heads * HEAD_DIM // 4     # q[row] as the wgmma B tile (u32 words)

    @cute.jit
    def load_q_fragments(self, mQ: cute.Tensor, row: Int32, g: Int32, tig: Int32, rQ: cute.Tensor):
        """q[row] as B fragments: n-tile j holds head 8 j + g; 8 words per head (see the permutation)."""
        base = mQ.iterator.toint() + Int64(row) * (self.num_heads * HEAD_DIM)
        for j in cutlass.range_constexpr(self.num_heads // 8):
            head_addr = base + (j * 8 + g) * HEAD_DIM + tig * 16
            for h in cutlass.range_constexpr(2):
                load_16b(head_addr + h * 64, cute.local_tile(rQ[j, None], (4,), (h,)))

    @cute.jit
    def load_weights(self, mW: cute.Tensor, row: Int32, tig: Int32, rW: cute.Tensor):
        """weights of the 2 accumulator columns this thread holds in each n-tile: heads 8 j + 2 tig + c."""
        for j in cutlass.range_constexpr(self.num_heads // 8):
            for c in cutlass.range_constexpr(2):
                rW[j, c] = mW[row, j * 8 + tig * 2 + c]

    @cute.jit
    def score_16_tokens(self, rQ: cute.Tensor, rW: cute.Tensor, rK: cute.Tensor, rS: cute.Tensor, tig: Int32) -> Float32:
        """Logits of the warp's 16 tokens (rows g and g + 8 of rK); returns the value of token
        g + 8 * tig for lanes with tig < 2 (the quad holds both after the reduction).

        sum_h w[h] relu(q_h . k) over Hi heads = over the n-tiles and the 2 columns per thread, then
        across the quad."""
        acc = cute.make_rmem_tensor((self.num_heads // 8, 4), Float32)
        acc.fill(0.0)
        for s in cutlass.range_constexpr(4):
            for j in cutlass.range_constexpr(self.num_heads // 8):
                d0, d1, d2, d3 = mma_e4m3_m16n8k32(
                    rK[0, 2 * s], rK[1, 2 * s], rK[0, 2 * s + 1], rK[1, 2 * s + 1],
                    rQ[j, 2 * s], rQ[j, 2 * s + 1],
                    acc[j, 0], acc[j, 1], acc[j, 2], acc[j, 3])
                acc[j, 0] = d0
                acc[j, 1] = d1
                acc[j, 2] = d2
                acc[j, 3] = d3
        v0 = Float32(0.0)  # token g
        v1 = Float32(0.0)  # token g + 8
        for j in cutlass.range_constexpr(self.num_heads // 8):
            for c in cutlass.range_constexpr(2):
                v0 = v0 + cute.arch.fmax(acc[j, c], Float32(0.0)) * rW[j, c]
                v1 = v1 + cute.arch.fmax(acc[j, 2 + c], Float32(0.0)) * rW[j, c]
        v0 = quad_sum(v0) * rS[0]
        v1 = quad_sum(v1) * rS[1]
        return v1 if tig == 1 else v0

    @cute.jit
    def store_q_smem(self, mQ: cute.Tensor, row: Int32, sQw: cute.Tensor, tidx: Int32, nthreads: cutlass.Constexpr):
        """q[row] -> sQw (u32 words of the B tile) in the layout above, dims in memory order. The
        caller fences (fence.proxy.async.shared::cta) and synchronizes before any wgmma reads it."""
        base = mQ.iterator.toint() + Int64(row) * (self.num_heads * HEAD_DIM)
        r = cute.make_rmem_tensor((4,), Uint32)
        for v in cutlass.range(tidx, self.num_heads * 8, nthreads, unroll=1):   # one 16-byte vector
            n = v // 8                    # head
            kv = v % 8                    # 16-byte chunk along K
            load_16b(base + n * HEAD_DIM + kv * 16, r)
            w0 = (n // 8) * (WG_SBO // 4) + kv * (WG_LBO // 4) + (n % 8) * 4
            for cc in cutlass.range_constexpr(4):
                sQw[w0 + cc] = r[cc]

    @cute.jit
    def score_page_wgmma(self, q_desc: Int64, rWs, rK: cute.Tensor, rS: cute.Tensor, tig: Int32):
        """score_16_tokens on the tensor cores of the warpgroup, for len(rWs) query rows whose q tiles
        lie back to back from q_desc (one m64n(Hi x rows)k32 chain: the K page is multiplied once).
        Every warp of the warpgroup must call it together (wgmma is warpgroup-collective). rK holds
        rows g, g + 8 of the warp's 16 tokens. Returns this lane's score (see relu_weighted_sums)."""
        acc = [Float32(0.0)] * (self.num_heads // 2 * len(rWs))
        cute.nvgpu.warpgroup.fence()
        for s in cutlass.range_constexpr(4):
            # k-step s reads logical chunks 2 s, 2 s + 1: start address + 256 s (descriptor units of 16 B)
            acc = wgmma_e4m3_k32(acc, rK[0, 2 * s], rK[1, 2 * s], rK[0, 2 * s + 1], rK[1, 2 * s + 1],
                                 q_desc + Int64(16 * s), Int32(0 if s == 0 else 1))
        cute.nvgpu.warpgroup.commit_group()
        cute.nvgpu.warpgroup.wait_group(0)
        return self.relu_weighted_sums(acc, rWs, rS, tig)

    @cute.jit
    def relu_weighted_sums(self, acc, rWs, rS: cute.Tensor, tig: Int32) -> Float32:
        """From the m64n(Hi x rows)k32 accumulators (rows = len(rWs), 1 or 2): sum_h w[r, h] relu(acc)
        times the token's K scale. Lane tig of a quad returns token g + 8 (tig % 2) of row
        (tig // 2) % rows (see quad_reduce)."""
        v = []                                   # per (row, token g / g + 8): this lane's partial sum
        for r in cutlass.range_constexpr(len(rWs)):
            v.extend(self.row_partials(acc, r * (self.num_heads // 8), rWs[r]))
        return self.quad_reduce(v, rS, tig)

    @cute.jit
    def row_partials(self, acc, n0: cutlass.Constexpr, rW: cute.Tensor):
        """This lane's sum_h w[h] relu(acc) over one row's Hi heads, the n-tiles n0 .. n0 + Hi / 8 of
        acc, for tokens g and g + 8 (two independent FFMA chains per token, one per column)."""
        p = [Float32(0.0)] * 4                  # (token g, col 0), (g, 1), (g + 8, 0), (g + 8, 1)
        for j in cutlass.range_constexpr(self.num_heads // 8):
            for e in cutlass.range_constexpr(4):
                p[e] = p[e] + cute.arch.fmax(fence_f32(acc[4 * (n0 + j) + e]), Float32(0.0)) * rW[j, e % 2]
        return [p[0] + p[1], p[2] + p[3]]

    @cute.jit
    def quad_reduce(self, v, rS: cute.Tensor, tig: Int32) -> Float32:
        """Reduce a quad's row_partials (v: 2 per row, rows 1 or 2) "transposed", each shuffle round
        halving the values a lane keeps instead of every lane summing all of them; times the
        token's K scale. Lane tig returns token g + 8 (tig % 2) of row (tig // 2) % rows."""
        rows = len(v) // 2
        odd = (tig & 1) != 0
        # round 1 (lanes tig, tig ^ 1): keep this lane's token, hand over the other one
        keep = []
        for r in cutlass.range_constexpr(rows):
            mine = v[2 * r + 1] if odd else v[2 * r]
            other = v[2 * r] if odd else v[2 * r + 1]
            keep.append(mine + cute.arch.shuffle_sync_bfly(other, offset=1))
        out = keep[0]
        if const_expr(rows == 2):
            # round 2 (lanes tig, tig ^ 2): keep this lane's row
            hi = (tig & 2) != 0
            mine = keep[1] if hi else keep[0]
            other = keep[0] if hi else keep[1]
            out = mine + cute.arch.shuffle_sync_bfly(other, offset=2)
        else:
            out = out + cute.arch.shuffle_sync_bfly(out, offset=2)
        return out * (rS[1] if odd else rS[0])

    @cute.jit
    def score_page_wgmma_ss(self, k_desc: Int64, q_desc: Int64, rWs, rS: cute.Tensor, tig: Int32):
        """score_page_wgmma with the K page as a shared-memory operand (k_sw128 layout, dims in memory
        order, as store_q_smem leaves q's tiles): no fragment loads and no A registers. One
        m64n(Hi x rows)k32 chain; returns this lane's score (see relu_weighted_sums)."""
        acc = [Float32(0.0)] * (self.num_heads // 2 * len(rWs))
        cute.nvgpu.warpgroup.fence()
        for s in cutlass.range_constexpr(4):
            # k-step s: 32 bytes further along K in the swizzled A rows, two core matrices in q's tile
            acc = wgmma_ss_e4m3_k32(acc, k_desc + Int64(2 * s), q_desc + Int64(16 * s), s > 0)
        cute.nvgpu.warpgroup.commit_group()
        cute.nvgpu.warpgroup.wait_group(0)
        return self.relu_weighted_sums(acc, rWs, rS, tig)
