"""Lightning indexer logits with fp8 warp mma.sync (the sm_120a form): one CTA per (row, run of
pages), every operand in registers. The K source (paged or contiguous) is the kernel class's
other base (logits.py); const_expr on self.paged picks its code."""
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32, const_expr

from .fp8_mma import HEAD_DIM, load_16b
from .k_pages import PAGE_SIZE, active_entries, load_page_rows
from .logits import TOKENS_PER_WARP, LogitsKernel


class WarpMmaLogits(LogitsKernel):
    """One CTA = 4 warps = one (row, run of 64-token pages); warp w scores tokens 16 w .. 16 w + 15
    of each page with fp8 mma.sync (tokens = M, heads = N, dims = K). q and the weights stay in
    registers for the whole run; the next page's K is loaded into registers while the current
    one is multiplied."""

    @cute.jit
    def launch(self, mQ, mW, mKV, mBlockTable, mLengths, mActiveWidth, mKVScale, mStarts, mEnds, mLogits,
               rows_per_req, has_active_width, pages_per_cta: Int32, stream):
        """pages_per_cta: the length of a CTA's run of pages."""
        pages = (mLogits.shape[1] + (PAGE_SIZE - 1)) // PAGE_SIZE
        grid = (mQ.shape[0], (pages + pages_per_cta - 1) // pages_per_cta, 1)
        self.kernel(
            mQ, mW, mKV, mBlockTable, mLengths, mActiveWidth, mKVScale, mStarts, mEnds, mLogits, rows_per_req,
            has_active_width, pages_per_cta,
        ).launch(grid=grid, block=[self.num_threads, 1, 1], stream=stream,
                 min_blocks_per_mp=self.min_ctas, preferred_smem_carveout=0)

    @cute.kernel
    def kernel(
        self, mQ, mW, mKV, mBlockTable, mLengths, mActiveWidth, mKVScale, mStarts, mEnds, mLogits, rows_per_req,
        has_active_width, pages_per_cta: Int32,
    ):
        row, cta, _ = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = cute.arch.lane_idx()
        g = lane // 4
        tig = lane % 4
        width = mLogits.shape[1]

        req = None          # the row's request (paged K only)
        if const_expr(self.paged):
            active = active_entries(width, mActiveWidth, has_active_width)
            valid_begin = Int32(0)
            valid_end = cutlass.min(cutlass.max(mLengths[row], 0) // self.compress_ratio, active)
            req = row // rows_per_req
        else:
            active = width
            n_kv = mKV.shape[0]
            valid_begin = cutlass.max(mStarts[row], 0)
            valid_end = cutlass.min(cutlass.min(mEnds[row], n_kv), width)
        n_pages = (active + (PAGE_SIZE - 1)) // PAGE_SIZE
        p_begin = cta * pages_per_cta
        p_end = cutlass.min(p_begin + pages_per_cta, n_pages)

        if p_begin < p_end:
            rQ = cute.make_rmem_tensor((self.num_heads // 8, 8), Uint32)
            rW = cute.make_rmem_tensor((self.num_heads // 8, 2), Float32)
            self.scorer.load_q_fragments(mQ, row, g, tig, rQ)
            self.scorer.load_weights(mW, row, tig, rW)

            rK = cute.make_rmem_tensor((2, 8), Uint32)      # rows g, g + 8 of this warp's 16 tokens
            rS = cute.make_rmem_tensor((2,), Float32)
            rKn = cute.make_rmem_tensor((2, 8), Uint32)     # the next page, in flight
            rSn = cute.make_rmem_tensor((2,), Float32)
            t_lo = warp * TOKENS_PER_WARP + g              # token of accumulator row g inside a page

            ok_next = self.issue_page(mKV, mBlockTable, req, mKVScale, p_begin, valid_begin, valid_end, t_lo, tig,
                                      rKn, rSn)
            gRow = mLogits[row, None]
            for p in cutlass.range(p_begin, p_end, unroll=1):
                rK.store(rKn.load())
                rS.store(rSn.load())
                ok = ok_next
                if p + 1 < p_end:
                    ok_next = self.issue_page(mKV, mBlockTable, req, mKVScale, p + 1, valid_begin, valid_end, t_lo,
                                              tig, rKn, rSn)
                page_lo = p * PAGE_SIZE
                # this thread's output token: row g (tig 0) or row g + 8 (tig 1) of the warp tile
                pos = page_lo + t_lo + 8 * tig
                val = -Float32.inf
                # pages wholly outside the row, or outside the cache (nothing was read for them),
                # are only filled with -inf (warp-uniform branch)
                if page_lo < valid_end and page_lo + PAGE_SIZE > valid_begin and ok != 0:
                    v = self.scorer.score_16_tokens(rQ, rW, rK, rS, tig)
                    if pos >= valid_begin and pos < valid_end:
                        val = v
                if tig < 2 and pos < active:
                    gRow[pos] = val

    @cute.jit
    def issue_page(self, mKV, mBlockTable, req, mKVScale, p, valid_begin, valid_end, t_lo, tig, rK, rS) -> Int32:
        """Start the loads of page p: rows t_lo and t_lo + 8 (32 bytes each) and their scales.
        Nothing is read for a page wholly outside the row (its block-table entry may be junk), nor
        for a block-table entry outside [0, blocks): returns 0 then (the page scores -inf), else 1."""
        ok = Int32(1)
        page_lo = p * PAGE_SIZE
        if page_lo < valid_end and page_lo + PAGE_SIZE > valid_begin:
            if const_expr(self.paged):
                ok = load_page_rows(mKV, mBlockTable[req, p], t_lo, tig, rK, rS, False)
            else:
                # rows past the end of kv would be out of bounds: read only rows < valid_end
                for r in cutlass.range_constexpr(2):
                    tok = page_lo + t_lo + 8 * r
                    if tok < valid_end:
                        row_addr = mKV.iterator.toint() + Int64(tok) * HEAD_DIM + tig * 16
                        for h in cutlass.range_constexpr(2):
                            load_16b(row_addr + h * 64, cute.local_tile(rK[r, None], (4,), (h,)))
                        rS[r] = mKVScale[tok]
        return ok
