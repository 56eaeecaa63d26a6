"""The tile step with Hopper warpgroup MMA, 64 heads as M: S = Q K^T per warpgroup (or all of
the tile by warpgroup 0, s_one_warpgroup), the online softmax, O += P V for each warpgroup's
value columns."""
import cutlass
import cutlass.cute as cute
from cutlass import Float32, const_expr
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import OperandMajorMode, warpgroup

from .barriers import BAR_MAX, named_arrive, named_sync
from .fragments import mn_view
from .softmax import max_step, quad_allreduce


class Wgmma64Heads:
    """64-head wgmma blocks. Config: head_block, tile_tokens, warps_n, mma_dtype, mma_threads,
    s_one_warpgroup, tokens_per_warp, dims_per_warp, d_qk, d_v."""

    def s_tokens(self):
        """Tokens of a tile one warpgroup's S covers: all of them (S_ONE_WARPGROUP) or its share."""
        return self.tile_tokens if self.s_one_warpgroup else self.tokens_per_warp

    def make_wg_mmas(self):
        """(S = Q K^T, O = P V) warpgroup MMAs: 64 x s_tokens() and 64 x d_v / WARPS_N."""
        mma_s = sm90_utils.make_trivial_tiled_mma(
            self.mma_dtype, self.mma_dtype, OperandMajorMode.K, OperandMajorMode.K, Float32,
            (1, 1, 1), (self.head_block, self.s_tokens()),
        )
        mma_o = sm90_utils.make_trivial_tiled_mma(
            self.mma_dtype, self.mma_dtype, OperandMajorMode.K, OperandMajorMode.MN, Float32,
            (1, 1, 1), (self.head_block, self.d_v // self.warps_n),
        )
        return mma_s, mma_o

    def o_acc_shape(self, thr_mma):
        """O accumulator: 64 heads x this warpgroup's d_v / WARPS_N value columns."""
        return thr_mma.partition_shape_C((self.head_block, self.dims_per_warp))

    @cute.jit
    def issue_s_wg(self, thr_mma, sQ, sKs, wn):
        """Issue S = Q K^T (wgmma 64 x s_tokens() x 16, Q and K from smem) for warpgroup wn's
        tokens and commit it; softmax_tile_wg waits for it."""
        # A fresh tiled MMA: its ACCUMULATE field is set here and must not leak elsewhere.
        mma_s, _ = self.make_wg_mmas()
        thr_mma_s = mma_s.get_slice(thr_mma.thr_idx)
        sK_w = cute.local_tile(sKs, (self.s_tokens(), self.d_qk), (wn, 0))
        tSrQ = thr_mma_s.make_fragment_A(thr_mma_s.partition_A(sQ))
        tSrK = thr_mma_s.make_fragment_B(thr_mma_s.partition_B(sK_w))
        acc_S = cute.make_rmem_tensor(thr_mma_s.partition_shape_C((self.head_block, self.s_tokens())), Float32)
        mma_s.set(warpgroup.Field.ACCUMULATE, False)
        warpgroup.fence()
        for k in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
            cute.gemm(mma_s, acc_S, tSrQ[None, None, k], tSrK[None, None, k], acc_S)
            mma_s.set(warpgroup.Field.ACCUMULATE, True)
        warpgroup.commit_group()
        return acc_S

    @cute.jit
    def softmax_tile_wg(
        self, thr_mma, sP, sBias, sRed, stage, wn, lane, acc_S, acc_O, row_max, row_sum,
        sm_scale_log2, sMax=None,
    ):
        """Warpgroup wn: wait for S = Q K^T over its s_tokens() tokens (issue_s_wg), online
        softmax in base 2, P -> smem, then a barrier over the MMA warps. Both warpgroups agree on
        a row's max through sRed; with S_ONE_WARPGROUP only warpgroup 0 runs this (its S covers
        the whole tile, so the max is its own): it leaves the new running max in sMax for
        warpgroup 1 (rescale_tile_wg) before its exp2, and rescales its own O only after P is
        out, so that warpgroup 1's P V starts first."""
        # Fresh tiled MMAs for this tile: their ACCUMULATE field is set inside the tile's loop,
        # and a field set there must not leak into the kernel-level objects (the epilogue's).
        mma_s, _ = self.make_wg_mmas()
        thr_mma_s = mma_s.get_slice(thr_mma.thr_idx)
        warpgroup.wait_group(0)
        tok0 = wn * self.s_tokens()               # this warpgroup's first token in the tile

        # ---- mask and row max ------------------------------------------------------------
        acc_S_mn = mn_view(acc_S)
        tScS_mn = mn_view(thr_mma_s.partition_C(cute.make_identity_tensor((self.head_block, self.s_tokens()))))
        for c in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[1])):
            bias = sBias[stage * self.tile_tokens + tok0 + tScS_mn[0, c][1]]
            for r in cutlass.range_constexpr(2):
                acc_S_mn[r, c] = acc_S_mn[r, c] + bias
        tile_max = cute.make_rmem_tensor((2,), Float32)
        for r in cutlass.range_constexpr(2):
            mx = acc_S_mn[r, None].load().reduce(cute.ReductionOp.MAX, -Float32.inf, 0)
            tile_max[r] = quad_allreduce(mx, True)
        if const_expr(not self.s_one_warpgroup):
            # both warpgroups must agree on the running max of a row
            if lane % 4 == 0:
                for r in cutlass.range_constexpr(2):
                    sRed[wn * self.head_block + tScS_mn[r, 0][0]] = tile_max[r]
            self.mma_sync()
            for r in cutlass.range_constexpr(2):
                for w in cutlass.range_constexpr(self.warps_n):
                    tile_max[r] = cute.arch.fmax(tile_max[r], sRed[w * self.head_block + tScS_mn[r, 0][0]])

        # ---- online softmax in base 2 ----------------------------------------------------
        acc_O_mn = mn_view(acc_O[0])
        new_max = cute.make_rmem_tensor((2,), Float32)
        for r in cutlass.range_constexpr(2):
            new_max[r] = cute.arch.fmax(row_max[r], tile_max[r])
        if const_expr(self.s_one_warpgroup):
            # the new maxima first: warpgroup 1 rescales its O while this one runs exp2
            if lane % 4 == 0:
                for r in cutlass.range_constexpr(2):
                    sMax[stage * self.head_block + tScS_mn[r, 0][0]] = new_max[r]
            named_arrive(BAR_MAX, self.mma_threads)
        corrs = cute.make_rmem_tensor((2,), Float32)
        for r in cutlass.range_constexpr(2):
            max_scaled, corr = max_step(row_max[r], new_max[r], sm_scale_log2)
            p = cute.math.exp2(acc_S_mn[r, None].load() * sm_scale_log2 - max_scaled, fastmath=True)
            acc_S_mn[r, None] = p
            row_sum[r] = row_sum[r] * corr + p.reduce(cute.ReductionOp.ADD, Float32.zero, 0)
            corrs[r] = corr
            if const_expr(not self.s_one_warpgroup):
                acc_O_mn[r, None] = acc_O_mn[r, None].load() * corr
            row_max[r] = new_max[r]

        # ---- P -> smem (the whole 64 x TILE_TOKENS tile is read by both warpgroups) --------
        # as the fragment's pairs of adjacent tokens (32-bit stores; element-wise stores were
        # 16-bit, each with its own swizzled address)
        rP = cute.make_rmem_tensor_like(acc_S, self.mma_dtype)
        rP.store(acc_S.load().to(self.mma_dtype))
        cute.autovec_copy(rP, thr_mma_s.partition_C(cute.local_tile(sP, (self.head_block, self.s_tokens()), (0, wn))))
        cute.arch.fence_view_async_shared()     # P (st.shared) is read by wgmma
        self.mma_sync()
        if const_expr(self.s_one_warpgroup):
            # O's rescale after P is out: warpgroup 1's P V starts meanwhile
            for r in cutlass.range_constexpr(2):
                acc_O_mn[r, None] = acc_O_mn[r, None].load() * corrs[r]


    @cute.jit
    def compute_tile_wg(
        self, thr_mma, sKs, sP, sBias, sRed, stage, wn, lane,
        acc_S, acc_O, row_max, row_sum, sm_scale_log2,
    ):
        """Warpgroup wn: the softmax of its share of S (softmax_tile_wg), then O[:, its
        d_v / WARPS_N columns] += P V (pv_wg). Every wgmma batch is fenced, committed and waited
        on before its registers or the smem it reads are touched again."""
        self.softmax_tile_wg(thr_mma, sP, sBias, sRed, stage, wn, lane, acc_S, acc_O, row_max, row_sum,
                             sm_scale_log2)
        self.pv_wg(thr_mma, sKs, sP, wn, acc_O)

    @cute.jit
    def pv_wg(self, thr_mma, sKs, sP, wn, acc_O):
        """O[:, warpgroup wn's d_v / WARPS_N columns] += P V over all tile tokens (wgmma
        64x256x16, P and V from smem), waited on before returning."""
        _, mma_o = self.make_wg_mmas()          # fresh: its ACCUMULATE field is set here
        thr_mma_o = mma_o.get_slice(thr_mma.thr_idx)
        sVt = cute.composition(sKs, cute.make_layout((self.d_v, self.tile_tokens), stride=(self.tile_tokens, 1)))
        sVt_w = cute.local_tile(sVt, (self.dims_per_warp, self.tile_tokens), (wn, 0))
        tOrP = thr_mma_o.make_fragment_A(thr_mma_o.partition_A(sP))
        tOrV = thr_mma_o.make_fragment_B(thr_mma_o.partition_B(sVt_w))
        mma_o.set(warpgroup.Field.ACCUMULATE, True)
        warpgroup.fence()
        for k in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
            cute.gemm(mma_o, acc_O[0], tOrP[None, None, k], tOrV[None, None, k], acc_O[0])
        warpgroup.commit_group()
        warpgroup.wait_group(0)


    @cute.jit
    def tile_by_role(
        self, role: cutlass.Constexpr, thr_mma, sKs, sP, sBias, sRed, sMax, stage, lane, acc_S, acc_O,
        row_max, row_sum, sm_scale_log2,
    ):
        """S_ONE_WARPGROUP, after warpgroup 0 issued the tile's S (acc_S; None in warpgroup 1):
        warpgroup 0 runs the softmax, warpgroup 1 waits for its P and rescales, and both add P V
        for their value columns."""
        if const_expr(role == 0):
            self.softmax_tile_wg(thr_mma, sP, sBias, sRed, stage, 0, lane, acc_S, acc_O, row_max, row_sum,
                                 sm_scale_log2, sMax=sMax)
        else:
            self.rescale_tile_wg(thr_mma, sMax, stage, acc_O, row_max, sm_scale_log2)
        self.pv_wg(thr_mma, sKs, sP, role, acc_O)

    @cute.jit
    def rescale_tile_wg(self, thr_mma, sMax, stage, acc_O, row_max, sm_scale_log2):
        """Warpgroup 1 (S_ONE_WARPGROUP): once warpgroup 0 published the tile's new maxima
        (BAR_MAX, before its exp2), apply the same correction 2^(old max - new max) to its O
        columns (same operations on the same values as warpgroup 0, so both agree bit for bit),
        then wait for P (the barrier that ends softmax_tile_wg). Its row sums stay 0: the
        epilogue adds warpgroup 0's."""
        named_sync(BAR_MAX, self.mma_threads)
        tOcO_mn = mn_view(thr_mma.partition_C(cute.make_identity_tensor((self.head_block, self.dims_per_warp))))
        acc_O_mn = mn_view(acc_O[0])
        for r in cutlass.range_constexpr(2):
            new_max = sMax[stage * self.head_block + tOcO_mn[r, 0][0]]
            _, corr = max_step(row_max[r], new_max, sm_scale_log2)
            acc_O_mn[r, None] = acc_O_mn[r, None].load() * corr
            row_max[r] = new_max
        self.mma_sync()                         # P of the tile is in smem
