"""Lightning indexer logits on sm_90a: fp8 wgmma with both operands in shared memory, persistent
CTAs over (row group, page) units. The K source (paged or contiguous) is the kernel class's
other base (logits.py); const_expr on self.paged picks its code."""
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32, const_expr

from .fp8_mma import HEAD_DIM, cp_async_4, cp_async_16, k_sw128, smem_desc, smem_desc_sw128, store_f32
from .k_pages import PAGE_SIZE, SCALE_OFF, active_entries
from .logits import TOKENS_PER_WARP, LogitsKernel

K_STAGE_BYTES = PAGE_SIZE * HEAD_DIM
K_STAGE_WORDS = K_STAGE_BYTES // 4
SMEM_CARVEOUT = 100             # percent: min_ctas x (q + stages pages)


class WgmmaLogits(LogitsKernel):
    """Persistent grid: the (row group, 64-token page) units of all rows are numbered row-major
    and CTA c takes units [c U, (c + 1) U), U = per_cta chosen by the planner so that one wave of
    CTAs covers the SMs evenly (no row-granular tail). One CTA = 4 warps = one warpgroup; a page
    is one wgmma m64n(Hi x rows)k32 chain (tokens = M, heads x rows = N, dims = K) with both
    operands in shared memory: the page as cp.async stored it (the wgmma 128-byte swizzle, dims
    in memory order) and q (reloaded when the CTA's units cross into the next row group). Pages
    arrive by cp.async into `stages` stages: while page u is multiplied, pages
    u + 1 .. u + stages - 1 are in flight. One barrier per page: it also frees the stage of page
    u - 1, which is refilled before page u's math.

    (A from registers costs more: loaded straight from global memory, ptxas moves every word into
    the operand quads right after its load and each page waits out a memory latency; read from a
    stage, the fragment loads add instructions to a per-page chain that is issue-bound, and 16
    registers, which this form saves: 94 at next_n 1, 128 with row pairs, so pairs run 4 CTAs per
    SM too. docs/notes/indexer-logits.md.)

    A row group is rows_per_unit consecutive query rows: paged, of one request (MTP); contiguous,
    any two rows, whose ranges' union is staged (a prefill's neighbouring rows differ by a token).
    Each staged page is scored against every row of the group, so K is read once for all of them."""

    def __init__(self, *, stages: int, **config):
        super().__init__(**config)
        self.stages = stages            # shared-memory stages of K pages (stages - 1 in flight, one scored)

    @cute.jit
    def launch(self, mQ, mW, mKV, mBlockTable, mLengths, mActiveWidth, mKVScale, mStarts, mEnds, mLogits,
               rows_per_req, has_active_width, units_per_cta: Int32, stream):
        """units_per_cta: (row group, page) units per CTA."""
        @cute.struct
        class SharedStorage:
            sQ: cute.struct.Align[cute.struct.MemRange[Uint32, self.scorer.q_smem_words * self.rows_per_unit], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[Uint32, self.stages * K_STAGE_WORDS], 1024]
            sS: cute.struct.Align[cute.struct.MemRange[Float32, self.stages * PAGE_SIZE], 16]
            sBlk: cute.struct.Align[cute.struct.MemRange[Int32, self.stages], 16]   # page of each stage, -1: none

        pages = (mLogits.shape[1] + (PAGE_SIZE - 1)) // PAGE_SIZE
        total = (mQ.shape[0] // self.rows_per_unit) * pages
        grid = ((total + units_per_cta - 1) // units_per_cta, 1, 1)
        self.kernel(
            mQ, mW, mKV, mBlockTable, mLengths, mActiveWidth, mKVScale, mStarts, mEnds, mLogits, rows_per_req,
            has_active_width, units_per_cta, SharedStorage,
        ).launch(grid=grid, block=[self.num_threads, 1, 1], stream=stream,
                 min_blocks_per_mp=self.min_ctas, preferred_smem_carveout=SMEM_CARVEOUT)

    @cute.kernel
    def kernel(
        self, mQ, mW, mKV, mBlockTable, mLengths, mActiveWidth, mKVScale, mStarts, mEnds, mLogits, rows_per_req,
        has_active_width, units_per_cta: Int32, SharedStorage: cutlass.Constexpr,
    ):
        nstage = self.stages
        rows_per_unit = self.rows_per_unit
        q_words = self.scorer.q_smem_words
        tidx, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = cute.arch.lane_idx()
        g = lane // 4
        tig = lane % 4
        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        sQw = storage.sQ.get_tensor(cute.make_layout(q_words))
        sS = storage.sS.get_tensor(cute.make_layout((PAGE_SIZE, nstage), stride=(1, PAGE_SIZE)))
        sBlk = storage.sBlk.get_tensor(cute.make_layout(nstage))
        q_desc = smem_desc(sQw.iterator.toint())      # the group's q tiles, back to back (N = Hi x rows)
        k_base = storage.sK.get_tensor(cute.make_layout(nstage * K_STAGE_WORDS)).iterator.toint()
        s_base = sS.iterator.toint()
        width = mLogits.shape[1]
        pages = (width + (PAGE_SIZE - 1)) // PAGE_SIZE          # unit stride of a row

        active = width
        if const_expr(self.paged):
            active = active_entries(width, mActiveWidth, has_active_width)
        else:
            n_kv = mKV.shape[0]
        n_act = (active + (PAGE_SIZE - 1)) // PAGE_SIZE
        u_begin = cta * units_per_cta
        u_end = cutlass.min(u_begin + units_per_cta, (mQ.shape[0] // rows_per_unit) * pages)
        t_lo = warp * TOKENS_PER_WARP + g              # token of accumulator row g inside a page

        # This thread's 16-byte pieces of a page: piece x = tidx + 128 k (k < 4) is token x // 8,
        # chunk x % 8 (coalesced), stored in the wgmma 128-byte swizzle (k_sw128): each stage is
        # the A operand of the page's chain as it is.
        k_desc = smem_desc_sw128(k_base)
        k_dst = k_base + k_sw128(tidx // 8, tidx % 8)  # this thread's first piece, stage 0 (see issue_page)
        s_dst = s_base + 16 * tidx                      # its 16 bytes of scales (tidx < 16), stage 0
        rWs = [cute.make_rmem_tensor((self.num_heads // 8, 2), Float32) for _ in range(rows_per_unit)]
        my_r = (tig >> 1) % rows_per_unit                       # the row of the group this lane writes
        my_end = Int32(0)                              # its valid end
        out_row = Int64(0)                             # byte address of its logits row
        rS = cute.make_rmem_tensor((2,), Float32)      # K scales of tokens g, g + 8 of the warp's 16
        c_row = u_begin // pages
        c_p = u_begin - c_row * pages
        if const_expr(self.paged):
            # Block-table entries are read 32 units ahead, a warp-wide batch at a time (lane l holds
            # the page of unit bt_base + l in rBt0, of bt_base + 32 + l in rBt1; -1 = nothing to
            # load), so the copies of a page never wait on a dependent block-table read.
            n_blocks = cutlass.max(mKV.shape[0], 0)   # a plain value: a shape scalar would make the compare signed
            bt_base = u_begin
            rBt0 = self.bt_entry(mBlockTable, rows_per_req, mLengths, u_begin + lane, u_end, pages, n_act, active,
                                 n_blocks)
            rBt1 = self.bt_entry(mBlockTable, rows_per_req, mLengths, u_begin + 32 + lane, u_end, pages, n_act,
                                 active, n_blocks)
            for i in cutlass.range_constexpr(nstage - 1):
                blk = cute.arch.shuffle_sync(rBt0, i)
                self.issue_page(mKV, blk, tidx, k_dst, s_dst, sBlk, i)
        else:
            # the issuing side's row group and the union of its rows' ranges, read once per group
            i_row = c_row
            i_p = c_p
            i_begin, i_end = self.group_bounds(mStarts, mEnds, mKV, active, i_row, u_begin < u_end)
            srcs = self.unit_sources(mKVScale, mKV, k_base, s_base, tidx)
            for i in cutlass.range_constexpr(nstage - 1):
                self.issue_unit(srcs, u_begin + i < u_end, i_p, n_act, i_begin, i_end, tidx, i)
                i_p = i_p + 1
                if i_p == pages:
                    i_p = 0
                    i_row = i_row + 1
                    i_begin, i_end = self.group_bounds(mStarts, mEnds, mKV, active, i_row,
                                                       u_begin + i + 1 < u_end)
        cur_row = Int32(-1)
        valid_begin = Int32(0)                         # the row group's earliest valid begin
        valid_end = Int32(0)                           # the row group's furthest valid end
        my_begin = Int32(0)                            # this lane's row's valid begin
        for u0 in cutlass.range(u_begin, u_end, nstage, unroll=1):
            for i in cutlass.range_constexpr(nstage):
                u = u0 + i
                if u < u_end:
                    row = c_row
                    p = c_p
                    if row != cur_row:
                        # a new row group: its q into shared memory (every earlier wgmma has completed)
                        cute.arch.sync_threads()
                        valid_end = Int32(0)
                        if const_expr(not self.paged):
                            valid_begin = Int32(0x7FFFFFFF)
                        for r in cutlass.range_constexpr(rows_per_unit):
                            qrow = row * rows_per_unit + r
                            self.scorer.store_q_smem(mQ, qrow, cute.make_tensor(sQw.iterator + r * q_words,
                                                                                cute.make_layout(q_words)),
                                                     tidx, self.num_threads)
                            self.scorer.load_weights(mW, qrow, tig, rWs[r])
                            begin_r = Int32(0)
                            if const_expr(self.paged):
                                end_r = cutlass.min(cutlass.max(mLengths[qrow], 0) // self.compress_ratio, active)
                            else:
                                begin_r = cutlass.max(mStarts[qrow], 0)
                                end_r = cutlass.min(cutlass.min(mEnds[qrow], n_kv), width)
                                valid_begin = cutlass.min(valid_begin, begin_r)
                            valid_end = cutlass.max(valid_end, end_r)
                            if my_r == r:
                                my_begin = begin_r
                                my_end = end_r
                        out_row = (mLogits.iterator.toint()
                                   + Int64(row * rows_per_unit + my_r) * Int64(mLogits.stride[0]) * 4)
                        cute.arch.fence_proxy("async.shared", space="cta")
                        cur_row = row
                    # Stage i holds unit u: this thread's copies are done once at most nstage - 2
                    # younger groups are pending, every thread's after the barrier. The barrier also
                    # means every thread is done with unit u - 1, so its stage is refilled right away:
                    # one barrier per page, and the next copy starts before this page's math.
                    cute.arch.cp_async_wait_group(nstage - 2)
                    # the page landed through the generic proxy; wgmma reads it through the async one
                    cute.arch.fence_proxy("async.shared", space="cta")
                    cute.arch.sync_threads()
                    if const_expr(self.paged):
                        v = u + nstage - 1
                        if v - bt_base >= 32:
                            rBt0 = rBt1
                            bt_base = bt_base + 32
                            rBt1 = self.bt_entry(mBlockTable, rows_per_req, mLengths, bt_base + 32 + lane, u_end,
                                                 pages, n_act, active, n_blocks)
                        blk = cute.arch.shuffle_sync(rBt0, v - bt_base)
                        self.issue_page(mKV, blk, tidx, k_dst, s_dst, sBlk, (i + nstage - 1) % nstage)
                    else:
                        self.issue_unit(srcs, u + nstage - 1 < u_end, i_p, n_act, i_begin, i_end, tidx,
                                        (i + nstage - 1) % nstage)
                        i_p = i_p + 1
                        if i_p == pages:
                            i_p = 0
                            i_row = i_row + 1
                            i_begin, i_end = self.group_bounds(mStarts, mEnds, mKV, active, i_row,
                                                               u + nstage < u_end)
                    page_lo = p * PAGE_SIZE
                    if p < n_act:
                        # this lane's output: token g + 8 (tig % 2) of the warp tile, row my_r
                        pos = page_lo + t_lo + 8 * (tig & 1)
                        # pages wholly outside the rows, or outside the cache (nothing was copied
                        # into their stage), only get -inf (uniform over the CTA)
                        live = page_lo < valid_end and page_lo + PAGE_SIZE > valid_begin
                        if const_expr(self.paged):
                            live = live and sBlk[i] >= 0   # the stage's page lies inside the cache
                        if live:
                            for r in cutlass.range_constexpr(2):
                                rS[r] = sS[t_lo + 8 * r, i]
                        val = -Float32.inf
                        if live:
                            score = self.scorer.score_page_wgmma_ss(k_desc + Int64(i * K_STAGE_BYTES // 16), q_desc,
                                                                    rWs, rS, tig)
                            if pos >= my_begin and pos < my_end:
                                val = score
                        if (rows_per_unit == 2 or tig < 2) and pos < active:
                            store_f32(out_row + Int64(pos) * 4, val)
                    c_p = c_p + 1
                    if c_p == pages:
                        c_p = 0
                        c_row = c_row + 1
        cute.arch.cp_async_wait_group(0)

    # ---- paged K ---------------------------------------------------------------------------
    @cute.jit
    def bt_entry(self, mBlockTable, rows_per_req, mLengths, w, u_end, pages, n_act, active, n_blocks) -> Int32:
        """Page of unit w (row group, p) from the block table, or -1 when the unit loads nothing:
        past the CTA's range, past the active width, wholly past its rows (the entry may be junk),
        or an entry outside [0, n_blocks) (its page then scores -inf)."""
        blk = Int32(-1)
        if w < u_end:
            grp = w // pages
            p = w - grp * pages
            end = Int32(0)
            for r in cutlass.range_constexpr(self.rows_per_unit):
                end = cutlass.max(end, cutlass.min(cutlass.max(mLengths[grp * self.rows_per_unit + r], 0)
                                                   // self.compress_ratio, active))
            if p < n_act and p * PAGE_SIZE < end:
                blk = mBlockTable[(grp * self.rows_per_unit) // rows_per_req, p]
                # one unsigned compare also catches the negative entries
                if Uint32(blk) >= Uint32(n_blocks):
                    blk = Int32(-1)
        return blk

    @cute.jit
    def issue_page(self, mKV, blk, tidx, k_dst, s_dst, sBlk, b: cutlass.Constexpr):
        """Copy page blk (64 x 128 e4m3 and the 64 scales) into stage b; nothing for blk < 0.
        Always commits one group, so the wait counts stay uniform. Piece tidx + 128 k is the
        page's bytes [16 (tidx + 128 k), +16): token tidx // 8 + 16 k, chunk tidx % 8, whose
        swizzled place is k_dst + 2048 k (the swizzle only sees token % 8). sBlk[b] records blk
        for the stage's consumer, behind the barrier that precedes it."""
        if tidx == 0:
            sBlk[b] = blk
        if blk >= 0:
            src = mKV.iterator.toint() + Int64(blk) * Int64(mKV.stride[0]) + 16 * tidx
            for k in cutlass.range_constexpr(PAGE_SIZE * 8 // self.num_threads):
                cp_async_16(k_dst + (b * K_STAGE_BYTES + k * (self.num_threads // 8) * HEAD_DIM),
                            src + k * self.num_threads * 16)
            if tidx < PAGE_SIZE // 4:
                cp_async_16(s_dst + b * PAGE_SIZE * 4, src + SCALE_OFF)
        cute.arch.cp_async_commit_group()

    # ---- contiguous K ----------------------------------------------------------------------
    @cute.jit
    def group_bounds(self, mStarts, mEnds, mKV, active, grp, live):
        """The union [begin, end) of row group grp's ranges, clipped to kv and the width; the empty
        range when not live (past the CTA's units: grp may lie past the rows)."""
        begin = Int32(0x7FFFFFFF)
        end = Int32(0)
        if live:
            for r in cutlass.range_constexpr(self.rows_per_unit):
                begin = cutlass.min(begin, cutlass.max(mStarts[grp * self.rows_per_unit + r], 0))
                end = cutlass.max(end, cutlass.min(cutlass.min(mEnds[grp * self.rows_per_unit + r], mKV.shape[0]),
                                                   active))
        return begin, end

    @cute.jit
    def unit_sources(self, mKVScale, mKV, k_base, s_base, tidx):
        """This thread's addresses for issue_unit at page 0, stage 0: its first K piece's swizzled
        place and source, its scale's place and source (found once, outside the unit loop)."""
        return (k_base + k_sw128(tidx // 8, tidx % 8), mKV.iterator.toint() + Int64(16 * tidx),
                s_base + 4 * tidx, mKVScale.iterator.toint() + Int64(4 * tidx))

    @cute.jit
    def issue_unit(self, srcs, live, p, n_act, begin, end, tidx, b):
        """Copy unit (row group, page p) into stage b: only tokens inside [begin, end), the union of
        the group's row ranges and kv (the other tokens of the tile, K bytes and scales, keep stale
        values; no logit of theirs is written, and each row masks the union down to its own range).
        The scales come by cp.async too: a plain load would hold the warp before the page's math.
        Always commits one group. srcs: unit_sources.

        Piece tidx + 128 k of the page is token tidx // 8 + 16 k, chunk tidx % 8: its source and
        its swizzled place (k_sw128 only sees token % 8) both move 2048 bytes per k, so each is one
        address per unit plus an immediate offset. A page wholly before `end` (all but a row's
        last) copies without per-token predicates; the scales stay 4-byte copies (kv_scale is only
        4-byte aligned)."""
        if live:
            page_lo = p * PAGE_SIZE
            if p < n_act and page_lo < end and page_lo + PAGE_SIZE > begin:
                k_dst, kv_src, s_dst, sc_src = srcs
                step = (self.num_threads // 8) * HEAD_DIM
                dst = k_dst + b * K_STAGE_BYTES
                src = kv_src + Int64(page_lo) * HEAD_DIM
                sd = s_dst + b * (PAGE_SIZE * 4)
                ss = sc_src + Int64(page_lo) * 4
                if page_lo + PAGE_SIZE <= end:
                    for k in cutlass.range_constexpr(PAGE_SIZE * 8 // self.num_threads):
                        cp_async_16(dst + k * step, src + k * step)
                    if tidx < PAGE_SIZE:
                        cp_async_4(sd, ss)
                else:
                    tok = page_lo + tidx // 8
                    for k in cutlass.range_constexpr(PAGE_SIZE * 8 // self.num_threads):
                        if tok + k * (self.num_threads // 8) < end:
                            cp_async_16(dst + k * step, src + k * step)
                    if tidx < PAGE_SIZE and page_lo + tidx < end:
                        cp_async_4(sd, ss)
        cute.arch.cp_async_commit_group()
