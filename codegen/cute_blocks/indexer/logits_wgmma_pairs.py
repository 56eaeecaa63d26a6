"""Lightning indexer logits on sm_90a for row pairs over contiguous K (prefill): WgmmaLogits with
the two rows' MMAs issued apart, so that each row's epilogue runs while the other's MMA does."""
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from .fp8_mma import smem_desc, smem_desc_sw128, store_f32, wgmma_ss_e4m3_k32
from .k_pages import PAGE_SIZE
from .logits import TOKENS_PER_WARP
from .logits_wgmma import K_STAGE_BYTES, WgmmaLogits


class PairedWgmmaLogits(WgmmaLogits):
    """The units, stages and copies of WgmmaLogits (rows_per_unit = 2, contiguous K), with each
    staged page multiplied as two m64n(Hi)k32 chains, one per row, committed as separate wgmma
    groups. WgmmaLogits waits for a page's whole m64n(2 Hi) chain and then runs its epilogue, so
    a warp's tensor-core time and its epilogue (one FMNMX and one FFMA per accumulator) add up;
    here the chains of rows 0 and 1 of page u + 1 overlap the epilogues of row 1 of page u and
    row 0 of page u + 1:

        barrier (page u + 1 landed; page u - 1's stage free, refilled)
        MMA (u + 1, row 0)  | epilogue (u, row 1), logits of page u stored
        MMA (u + 1, row 1)  | wait (u + 1, row 0), epilogue (u + 1, row 0): its partial sums kept
        wait (u + 1, row 1)

    The accumulators are the same 2 x Hi / 2 registers a thread as one m64n(2 Hi) chain's. A new
    row group drains the pipeline (page u finished before q and the weights are replaced)."""

    def __init__(self, **config):
        super().__init__(**config)
        assert self.rows_per_unit == 2 and self.stages >= 3

    @cute.kernel
    def kernel(
        self, mQ, mW, mKV, mBlockTable, mLengths, mActiveWidth, mKVScale, mStarts, mEnds, mLogits, rows_per_req,
        has_active_width, units_per_cta: Int32, SharedStorage: cutlass.Constexpr,
    ):
        assert not self.paged
        nstage = self.stages
        q_words = self.scorer.q_smem_words
        heads = self.num_heads
        tidx, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = cute.arch.lane_idx()
        g = lane // 4
        tig = lane % 4
        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        sQw = storage.sQ.get_tensor(cute.make_layout(2 * q_words))
        sS = storage.sS.get_tensor(cute.make_layout((PAGE_SIZE, nstage), stride=(1, PAGE_SIZE)))
        q_desc = smem_desc(sQw.iterator.toint())      # row 0's q tile; row 1's q_words * 4 bytes on
        k_base = storage.sK.get_tensor(cute.make_layout(nstage * K_STAGE_BYTES // 4)).iterator.toint()
        s_base = sS.iterator.toint()
        k_desc = smem_desc_sw128(k_base)
        width = mLogits.shape[1]
        pages = (width + (PAGE_SIZE - 1)) // PAGE_SIZE          # unit stride of a row
        n_kv = mKV.shape[0]
        u_begin = cta * units_per_cta
        u_end = cutlass.min(u_begin + units_per_cta, (mQ.shape[0] // 2) * pages)
        t_lo = warp * TOKENS_PER_WARP + g              # token of accumulator row g inside a page
        rWs = [cute.make_rmem_tensor((heads // 8, 2), Float32) for _ in range(2)]
        my_r = (tig >> 1) % 2                          # the row of the pair this lane writes
        rS = cute.make_rmem_tensor((2,), Float32)

        # issuing side: units u_begin .. u_begin + nstage - 2 into stages 0 .. nstage - 2
        i_row = u_begin // pages
        i_p = u_begin - i_row * pages
        i_begin, i_end = self.group_bounds(mStarts, mEnds, mKV, width, i_row, u_begin < u_end)
        srcs = self.unit_sources(mKVScale, mKV, k_base, s_base, tidx)
        for i in cutlass.range_constexpr(nstage - 1):
            self.issue_unit(srcs, u_begin + i < u_end, i_p, pages, i_begin, i_end, tidx, i)
            i_p = i_p + 1
            if i_p == pages:
                i_p = 0
                i_row = i_row + 1
                i_begin, i_end = self.group_bounds(mStarts, mEnds, mKV, width, i_row, u_begin + i + 1 < u_end)

        # scoring side: the pair of unit u_begin, its first page's MMAs and row 0's epilogue
        row = u_begin // pages                         # row group of the next unit to start
        p = u_begin - row * pages                      # its page
        valid_begin, valid_end, my_begin, my_end, out_row = self.load_pair(mQ, mW, mStarts, mEnds, mLogits, n_kv,
                                                                           width, row, sQw, tidx, tig, my_r, rWs)
        cute.arch.cp_async_wait_group(nstage - 2)
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.sync_threads()
        # Register tensors, not lists: they are carried from one unit to the next. Every page is
        # multiplied, a dead one's (outside both rows; stale stage) too: finish() discards it.
        acc0 = cute.make_rmem_tensor((heads // 2,), Float32)
        acc1 = cute.make_rmem_tensor((heads // 2,), Float32)
        kept = cute.make_rmem_tensor((2,), Float32)    # row 0's partial sums of the unit in flight
        q1_desc = q_desc + Int64(q_words * 4 // 16)
        live = p * PAGE_SIZE < valid_end and p * PAGE_SIZE + PAGE_SIZE > valid_begin
        self.mma_row(acc0, k_desc, q_desc)
        self.mma_row(acc1, k_desc, q1_desc)
        cute.nvgpu.warpgroup.wait_group(1)
        self.keep_row0(kept, acc0, rWs[0])
        cute.nvgpu.warpgroup.wait_group(0)
        f_p = p                                        # the unit in flight: its page and liveness
        f_live = live

        # One straight-line body per unit, the stages counted at run time: the accumulators are
        # assigned only at its top level, and no MMA is in flight across the loop's back edge
        # (ptxas serialises every wgmma of a loop that carries one: C7514). So row 1's MMA of
        # page u + 1 is waited for at the end of the body, and finish(u) reads a complete acc1.
        st = Int32(0)                                  # stage of unit u
        for u in cutlass.range(u_begin, u_end, unroll=1):
            st1 = st + 1                               # stage of unit u + 1
            if st1 == nstage:
                st1 = Int32(0)
            # this thread's copies of unit u + 1 are done once at most nstage - 3 younger groups
            # are pending, every thread's after the barrier, which also means every thread is done
            # with unit u - 1: its stage (the one after u + 1's) is refilled right away
            cute.arch.cp_async_wait_group(nstage - 3)
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.sync_threads()
            st_fill = st + (nstage - 1)
            if st_fill >= nstage:
                st_fill = st_fill - nstage
            self.issue_unit(srcs, u + nstage - 1 < u_end, i_p, pages, i_begin, i_end, tidx, st_fill)
            i_p = i_p + 1
            if i_p == pages:
                i_p = 0
                i_row = i_row + 1
                i_begin, i_end = self.group_bounds(mStarts, mEnds, mKV, width, i_row, u + nstage < u_end)
            p = p + 1
            if p == pages:
                p = 0
                row = row + 1
            nxt = u + 1 < u_end
            pending = cutlass.Boolean(True)            # unit u not finished yet
            if nxt and p == 0:
                # a new pair: finish unit u under the old one, then its q and weights
                self.finish(acc1, kept, rWs[1], sS, st, f_p, f_live, t_lo, tig, my_begin, my_end, out_row, width, rS)
                pending = cutlass.Boolean(False)
                cute.arch.sync_threads()
                valid_begin, valid_end, my_begin, my_end, out_row = self.load_pair(
                    mQ, mW, mStarts, mEnds, mLogits, n_kv, width, row, sQw, tidx, tig, my_r, rWs)
                cute.arch.fence_proxy("async.shared", space="cta")
                cute.arch.sync_threads()
            live = nxt and p * PAGE_SIZE < valid_end and p * PAGE_SIZE + PAGE_SIZE > valid_begin
            kd = k_desc + Int64(st1 * (K_STAGE_BYTES // 16))
            self.mma_row(acc0, kd, q_desc)
            if pending:
                self.finish(acc1, kept, rWs[1], sS, st, f_p, f_live, t_lo, tig, my_begin, my_end, out_row, width, rS)
            self.mma_row(acc1, kd, q1_desc)
            cute.nvgpu.warpgroup.wait_group(1)
            self.keep_row0(kept, acc0, rWs[0])
            cute.nvgpu.warpgroup.wait_group(0)
            f_p = p
            f_live = live
            st = st1
        cute.nvgpu.warpgroup.wait_group(0)
        cute.arch.cp_async_wait_group(0)

    @cute.jit
    def mma_row(self, acc: cute.Tensor, k_desc: Int64, q_desc: Int64):
        """acc <- the staged page (M = 64 tokens) times one row's q tile (N = Hi heads), K = 128 dims:
        one wgmma group, committed, not waited for."""
        cute.nvgpu.warpgroup.fence()
        a = [Float32(0.0)] * (self.num_heads // 2)
        for s in cutlass.range_constexpr(4):
            # k-step s: 32 bytes further along K in the swizzled A rows, two core matrices in q's tile
            a = wgmma_ss_e4m3_k32(a, k_desc + Int64(2 * s), q_desc + Int64(16 * s), s > 0)
        for k in cutlass.range_constexpr(self.num_heads // 2):
            acc[k] = a[k]
        cute.nvgpu.warpgroup.commit_group()

    @cute.jit
    def keep_row0(self, kept: cute.Tensor, acc0: cute.Tensor, rW0: cute.Tensor):
        """Row 0's partial sums (tokens g, g + 8) of the unit whose row-0 MMA was waited for."""
        v = self.scorer.row_partials(acc0, 0, rW0)
        kept[0] = v[0]
        kept[1] = v[1]

    @cute.jit
    def finish(self, acc1, kept, rW1, sS, b, p, live, t_lo, tig, my_begin, my_end, out_row, width,
               rS):
        """Row 1's epilogue of the unit in stage b (page p; its MMA waited for), the pair's quad
        reduction and this lane's logit stored: -inf outside its row's range or on a dead page."""
        page_lo = p * PAGE_SIZE
        pos = page_lo + t_lo + 8 * (tig & 1)           # token g + 8 (tig % 2) of the warp tile
        val = -Float32.inf
        if live:
            for r in cutlass.range_constexpr(2):
                rS[r] = sS[t_lo + 8 * r, b]
            v = [kept[0], kept[1]]
            v.extend(self.scorer.row_partials(acc1, 0, rW1))
            score = self.scorer.quad_reduce(v, rS, tig)
            if pos >= my_begin and pos < my_end:
                val = score
        if pos < width:
            store_f32(out_row + Int64(pos) * 4, val)

    @cute.jit
    def load_pair(self, mQ, mW, mStarts, mEnds, mLogits, n_kv, width, grp, sQw, tidx, tig, my_r, rWs):
        """Pair grp's q tiles into shared memory and weights into rWs (the caller fences and
        synchronizes before an MMA reads them; every earlier MMA has completed). Returns the union
        of the rows' valid ranges, this lane's row's range and its logits row's byte address."""
        q_words = self.scorer.q_smem_words
        valid_begin = Int32(0x7FFFFFFF)
        valid_end = Int32(0)
        my_begin = Int32(0)
        my_end = Int32(0)
        for r in cutlass.range_constexpr(2):
            qrow = grp * 2 + r
            self.scorer.store_q_smem(mQ, qrow, cute.make_tensor(sQw.iterator + r * q_words, cute.make_layout(q_words)),
                                     tidx, self.num_threads)
            self.scorer.load_weights(mW, qrow, tig, rWs[r])
            begin_r = cutlass.max(mStarts[qrow], 0)
            end_r = cutlass.min(cutlass.min(mEnds[qrow], n_kv), width)
            valid_begin = cutlass.min(valid_begin, begin_r)
            valid_end = cutlass.max(valid_end, end_r)
            if my_r == r:
                my_begin = begin_r
                my_end = end_r
        out_row = mLogits.iterator.toint() + Int64(grp * 2 + my_r) * Int64(mLogits.stride[0]) * 4
        return valid_begin, valid_end, my_begin, my_end, out_row
