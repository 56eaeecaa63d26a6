"""Exact top-k of wide rows: a threshold from one row histogram, then ranked writes.

A row wider than one chunk is split over several CTAs; CTA c of a row covers tiles_per_cta
consecutive tiles of `tile` logits (the planner picks tiles_per_cta so that the whole grid is
one wave of resident CTAs: many CTAs per row at batch 1, one or a few at large batches).
  1. each CTA adds the histogram of the top `bits` key bits of its tiles into the row
     histogram; the last CTA of the row to arrive finds the threshold bin T (the bin holding the
     K-th largest key) and publishes it;
  2. each CTA counts its keys above T and in T, per (tile, warp), and publishes its totals;
  3. keys above T are winners, written at their rank in position order; keys in T go, in
     position order, to the row's tie buffer.
Steps 2 and 3 re-read the tiles. Step 2 also keeps, per 32 positions, the ballot of the lanes
holding a key >= T (about 2-3% of the keys), and step 3 loads only those: most 32-byte sectors
of the row are then never read a third time. The CTAs of a row wait for each other between
the steps, so they must be resident together: the grid is (CTAs per row, rows), within one wave,
and the chunk index is the fastest (a row's CTAs launch together). The caller zeroes the
histogram and its sync words before every launch.
wide_ties then takes, per row, the `need` largest of the tie buffer by the radix select in
shared memory (lowest positions first among equal keys) and writes the -1 / -inf tail. When T
holds more keys than the tie buffer (heavily repeated scores), it selects them from the row in
global memory instead: slower, still exact. Every write lands at a fixed rank, so the output is
deterministic run to run.

Written once here and imported by the generated top-k modules; WideChunk and WideTies hold
their tiling as Python ints (every loop over it unrolls at trace time). Scores are optional as in
select.py: mScores = None, or the *WithScores classes whose entry points take them."""
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op

from .select import BINS, RadixSelectMixin, bits_f32, row_bounds, score_to_key, write_winner

SMEM_PER_SM = {"sm_90a": 228 << 10, "sm_120a": 100 << 10}   # shared memory an SM can hold


@cute.jit
def gptr(t, row: Int32, col: Int32):
    """LLVM pointer to t[row, col] of a row-major 2-D global tensor."""
    return (t[row, None].iterator + col).llvm_ptr


@cute.jit
def load_gpu(t, row: Int32, col: Int32) -> Int32:
    """t[row, col] as another CTA left it (ld.relaxed.gpu: not served from a stale L1 line)."""
    return Int32(cute.arch.load(gptr(t, row, col), Int32, sem="relaxed", scope="gpu"))


@dsl_user_op
def nanosleep(ns: int, *, loc=None, ip=None):
    llvm.inline_asm(None, [], f"nanosleep.u32 {ns};", "", has_side_effects=True, is_align_stack=False,
                    asm_dialect=llvm.AsmDialect.AD_ATT)


@cute.jit
def wait_for(t, row: Int32, col: Int32, target: Int32):
    """Spin (one thread) until t[row, col] >= target, with acquire semantics; the sleeps keep the
    polling of many waiting CTAs off the L2."""
    seen = Int32(cute.arch.load(gptr(t, row, col), Int32, sem="acquire", scope="gpu"))
    while seen < target:
        nanosleep(64)
        seen = Int32(cute.arch.load(gptr(t, row, col), Int32, sem="acquire", scope="gpu"))


@cute.jit
def signal(t, row: Int32, col: Int32):
    """Add 1 to t[row, col] after this thread's earlier writes (release)."""
    cute.arch.fence_acq_rel_gpu()
    cute.arch.red(gptr(t, row, col), Int32(1), op="add", dtype="s32", sem="release", scope="gpu")


class WideChunk(RadixSelectMixin):
    """The three steps above for one CTA's tiles; grid (ceil(tiles / tiles_per_cta), rows)."""

    def __init__(self, tile: int, num_threads: int, min_ctas: int, bits: int, max_width: int, tie_cap: int,
                 count_backwards: bool, hit_tiles: int, arch: str):
        """tile: logits per tile (a multiple of num_threads); min_ctas: resident CTAs per SM (the
        planner's wave); bits: top key bits of the row histogram; max_width sizes the per-CTA tile
        table; tie_cap: keys of the threshold bin the tie buffer holds. count_backwards: step 2 goes
        over the tiles last to first (the ones step 1 read last are the likeliest still in L2, and
        step 3, first to last, then starts on the ones read last here; sm_90a: forward elsewhere,
        where the reversed loop spills at the 64-register cap). hit_tiles: tiles per CTA whose hit
        masks step 2 keeps for step 3 (a tile past them is read whole a third time). The shared
        memory of min_ctas CTAs must fit the SM: the row-wide waits need them resident together."""
        self.tile = tile
        self.num_threads = num_threads
        self.num_warps = num_threads // 32
        self.min_ctas = min_ctas
        self.hist_bins = 1 << bits
        self.shift = 32 - bits
        self.per_lane = tile // num_threads          # logits per lane per tile
        self.warp_span = 32 * self.per_lane          # consecutive positions of a tile owned by one warp
        self.max_tiles = (max_width + tile - 1) // tile
        self.tie_cap = tie_cap
        self.count_backwards = count_backwards
        self.hit_tiles = hit_tiles
        # 4-byte words of the shared-memory regions (SharedStorage in launch)
        self.cnt_words = self.max_tiles * self.num_warps * 2
        self.hit_words = hit_tiles * self.num_warps * self.per_lane
        self.state_words = 2 * self.num_warps + 8
        # bytes a CTA takes: the regions, their 16-byte alignment, the 1 KB the SM reserves a CTA
        smem = 4 * (self.hist_bins + self.cnt_words + self.hit_words + self.state_words) + 4 * 16 + 1024
        assert min_ctas * smem <= SMEM_PER_SM[arch], (arch, min_ctas, smem)
        self.carveout = min(100, -(-100 * min_ctas * smem // SMEM_PER_SM[arch]) + 1)
        self.sync_arrive = self.hist_bins          # mHist[row, sync_*]: the row's sync words
        self.sync_ready = self.hist_bins + 1
        self.sync_counted = self.hist_bins + 2
        assert self.hist_bins % num_threads == 0 and tile % num_threads == 0

    @cute.jit
    def __call__(
        self,
        mLogits: cute.Tensor,      # [rows, width] f32, row stride >= width
        mStarts: cute.Tensor,      # [rows] i32 first valid position (has_starts != 0)
        mEnds: cute.Tensor,        # [rows] i32 end of the row in tokens, divided by `ratio`
        mActiveWidth: cute.Tensor, # [1] i32 active width in entries (has_active_width != 0)
        mBlockTable: cute.Tensor,  # [requests, pages] i32 (physical != 0)
        mHist: cute.Tensor,        # [rows, self.hist_bins + 4] i32: histogram, then sync words; zero at launch
        mCnt: cute.Tensor,         # [rows, 2 * CTAs per row] i32: keys above T, keys in T, per CTA
        mState: cute.Tensor,       # [rows, 4] i32: T (-1: every valid key wins), above T, in T, valid
        mTieKey: cute.Tensor,      # [rows, self.tie_cap] i32 keys in T, position order
        mTiePos: cute.Tensor,      # [rows, self.tie_cap] i32 their positions
        mIdx: cute.Tensor,         # [rows, k] i32
        k: Int32,
        ratio: Int32,
        has_starts: Int32,
        has_active_width: Int32,
        physical: Int32,           # 0: row-relative positions; N: physical slots of an N-page cache
        rows_per_req: Int32,
        tiles_per_cta: Int32,
        stream,
    ):
        self.launch(mLogits, mStarts, mEnds, mActiveWidth, mBlockTable, mHist, mCnt, mState, mTieKey, mTiePos, mIdx,
                    None, k, ratio, has_starts, has_active_width, physical, rows_per_req, tiles_per_cta, stream)

    @cute.jit
    def launch(self, mLogits, mStarts, mEnds, mActiveWidth, mBlockTable, mHist, mCnt, mState, mTieKey, mTiePos, mIdx,
               mScores, k: Int32, ratio: Int32, has_starts: Int32, has_active_width: Int32, physical: Int32,
               rows_per_req: Int32, tiles_per_cta: Int32, stream):
        """The kernel's launch; mScores is None without scores."""
        @cute.struct
        class SharedStorage:
            sHist: cute.struct.Align[cute.struct.MemRange[Int32, self.hist_bins], 16]
            sCnt: cute.struct.Align[cute.struct.MemRange[Int32, self.cnt_words], 16]
            sHit: cute.struct.Align[cute.struct.MemRange[Uint32, self.hit_words], 16]
            sState: cute.struct.Align[cute.struct.MemRange[Int32, self.state_words], 16]

        tiles = (mLogits.shape[1] + self.tile - 1) // self.tile
        ctas = (tiles + tiles_per_cta - 1) // tiles_per_cta
        self.kernel(
            mLogits, mStarts, mEnds, mActiveWidth, mBlockTable, mHist, mCnt, mState, mTieKey, mTiePos, mIdx, mScores,
            k, ratio, has_starts, has_active_width, physical, rows_per_req, tiles_per_cta, SharedStorage,
        ).launch(grid=(ctas, mIdx.shape[0], 1), block=[self.num_threads, 1, 1], stream=stream,
                 min_blocks_per_mp=self.min_ctas, preferred_smem_carveout=self.carveout)

    @cute.kernel
    def kernel(
        self, mLogits, mStarts, mEnds, mActiveWidth, mBlockTable, mHist, mCnt, mState, mTieKey, mTiePos, mIdx, mScores,
        k: Int32, ratio: Int32, has_starts: Int32, has_active_width: Int32, physical: Int32,
        rows_per_req: Int32, tiles_per_cta: Int32, SharedStorage: cutlass.Constexpr,
    ):
        # wide_ties may be scheduled now: every CTA of this grid is resident (one wave) once all
        # have passed here, and wide_ties waits for this grid to finish before it reads anything
        cute.arch.griddepcontrol_launch_dependents()
        tidx, _, _ = cute.arch.thread_idx()
        cta, row, _ = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = cute.arch.lane_idx()
        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        sHist = storage.sHist.get_tensor(cute.make_layout(self.hist_bins))
        sCnt = storage.sCnt.get_tensor(cute.make_layout((2, self.num_warps, self.max_tiles)))
        sHit = storage.sHit.get_tensor(cute.make_layout((self.per_lane, self.num_warps, self.hit_tiles)))
        sState = storage.sState.get_tensor(cute.make_layout(2 * self.num_warps + 8))
        tiles = (mLogits.shape[1] + self.tile - 1) // self.tile
        ctas = (tiles + tiles_per_cta - 1) // tiles_per_cta
        start, end = row_bounds(mLogits, mStarts, mEnds, mActiveWidth, row, ratio, has_starts, has_active_width)
        t0 = cta * tiles_per_cta
        n_tiles = cutlass.max(cutlass.min(tiles_per_cta, tiles - t0), 0)
        rKeys = cute.make_rmem_tensor((self.per_lane,), Uint32)
        gRow = cute.recast_tensor(mLogits[row, None], Uint32)

        # 1. row histogram; the last CTA to arrive publishes the threshold
        for q in cutlass.range_constexpr(self.hist_bins // self.num_threads):
            sHist[q * self.num_threads + tidx] = Int32(0)
        cute.arch.sync_threads()
        for t in cutlass.range(n_tiles, unroll=1):
            base, lo, hi = self.tile_span(t0 + t, warp, start, end)
            if hi - lo == self.tile:
                self.hist_tile(gRow, sHist, base, lo, hi, lane, rKeys, True)
            elif hi > lo:
                self.hist_tile(gRow, sHist, base, lo, hi, lane, rKeys, False)
        cute.arch.sync_threads()
        for q in cutlass.range_constexpr(self.hist_bins // self.num_threads):
            b = q * self.num_threads + tidx
            c = sHist[b]
            if c != 0:
                cute.arch.red(gptr(mHist, row, b), c, op="add", dtype="s32", sem="relaxed", scope="gpu")
        cute.arch.sync_threads()
        if tidx == 0:
            cute.arch.fence_acq_rel_gpu()
            arrived = cute.arch.atomic_add(gptr(mHist, row, self.sync_arrive), Int32(1), sem="acq_rel", scope="gpu")
            sState[2 * self.num_warps] = Int32(arrived == ctas - 1)
        cute.arch.sync_threads()
        if sState[2 * self.num_warps] != 0:
            bin_t, above, in_t, total = self.threshold_bin(mHist, row, k, sState, tidx, warp, lane)
            if tidx == 0:
                mState[row, 0] = bin_t
                mState[row, 1] = above
                mState[row, 2] = in_t
                mState[row, 3] = total
                signal(mHist, row, self.sync_ready)
        if tidx == 0:
            wait_for(mHist, row, self.sync_ready, Int32(1))
        cute.arch.sync_threads()
        bin_t = load_gpu(mState, row, 0)
        keep_ties = load_gpu(mState, row, 2) <= self.tie_cap
        # T among the non-negative scores (below the top bin): full tiles count on the raw bits
        # (count_tile_raw), the thresholds as signed ints
        raw = bin_t >= self.hist_bins // 2 and bin_t < self.hist_bins - 1
        lo_s = (bin_t - self.hist_bins // 2) << self.shift
        hi_s = lo_s + (1 << self.shift)

        # 2. keys above T and in T per (tile, warp); the CTA's totals are published.
        # (last to first with count_backwards, see __init__)
        t_first, t_stop, t_step = (n_tiles - 1, -1, -1) if const_expr(self.count_backwards) else (0, n_tiles, 1)
        for t in cutlass.range(t_first, t_stop, t_step, unroll=1):
            base, lo, hi = self.tile_span(t0 + t, warp, start, end)
            packed = Int32(0)
            if hi - lo == self.tile:
                if raw:
                    packed = self.count_tile_raw(gRow, sHit, t, base, warp, lane, rKeys, lo_s, hi_s)
                else:
                    packed = self.count_tile(gRow, sHit, t, base, lo, hi, warp, lane, rKeys, bin_t, True)
            elif hi > lo:
                packed = self.count_tile(gRow, sHit, t, base, lo, hi, warp, lane, rKeys, bin_t, False)
            if lane == 0:
                sCnt[0, warp, t] = packed & Int32(0xFFFF)
                sCnt[1, warp, t] = packed >> Int32(16)
        cute.arch.sync_threads()
        mine_gt = Int32(0)
        mine_tie = Int32(0)
        for i in cutlass.range(tidx, n_tiles * self.num_warps, self.num_threads, unroll=1):
            mine_gt = mine_gt + sCnt[0, i % self.num_warps, i // self.num_warps]
            mine_tie = mine_tie + sCnt[1, i % self.num_warps, i // self.num_warps]
        n_gt = self.block_total(mine_gt, sState, tidx, warp, lane)
        n_tie = self.block_total(mine_tie, sState, tidx, warp, lane)
        if tidx == 0:
            mCnt[row, 2 * cta] = n_gt
            mCnt[row, 2 * cta + 1] = n_tie
            signal(mHist, row, self.sync_counted)
            wait_for(mHist, row, self.sync_counted, ctas)
        cute.arch.sync_threads()

        # 3. ranks after the earlier CTAs' keys: winners to the output, keys in T to the buffer
        c_gt = Int32(0)
        c_tie = Int32(0)
        for c in cutlass.range(tidx, cta, self.num_threads, unroll=1):
            c_gt = c_gt + load_gpu(mCnt, row, 2 * c)
            c_tie = c_tie + load_gpu(mCnt, row, 2 * c + 1)
        run_gt = self.block_total(c_gt, sState, tidx, warp, lane)
        run_tie = self.block_total(c_tie, sState, tidx, warp, lane)
        for t in cutlass.range(n_tiles, unroll=1):
            # this warp's offset: every warp of the earlier tiles, the earlier warps of this one
            for w in cutlass.range_constexpr(self.num_warps):
                if w < warp:
                    run_gt = run_gt + sCnt[0, w, t]
                    run_tie = run_tie + sCnt[1, w, t]
            base, lo, hi = self.tile_span(t0 + t, warp, start, end)
            if sCnt[0, warp, t] + sCnt[1, warp, t] > 0:
                args = (mIdx, mScores, mBlockTable, mTieKey, mTiePos, row, start, physical, rows_per_req, keep_ties, bin_t)
                if hi - lo == self.tile:
                    self.write_tile(gRow, sHit, t, base, lo, hi, warp, lane, rKeys, run_gt, run_tie, args, True)
                else:
                    self.write_tile(gRow, sHit, t, base, lo, hi, warp, lane, rKeys, run_gt, run_tie, args, False)
                run_gt = run_gt + sCnt[0, warp, t]
                run_tie = run_tie + sCnt[1, warp, t]
            for w in cutlass.range_constexpr(self.num_warps):
                if w > warp:
                    run_gt = run_gt + sCnt[0, w, t]
                    run_tie = run_tie + sCnt[1, w, t]

    @cute.jit
    def tile_span(self, tile: Int32, warp: Int32, start: Int32, end: Int32):
        """(this warp's first position in the tile, the tile's valid range [lo, hi))."""
        lo = cutlass.max(start, tile * self.tile)
        hi = cutlass.min(end, tile * self.tile + self.tile)
        return tile * self.tile + warp * self.warp_span, lo, hi

    @cute.jit
    def load_keys(self, gRow, base: Int32, lo: Int32, hi: Int32, lane: Int32, rKeys, full: cutlass.Constexpr):
        """The warp's self.per_lane x 32 positions from `base` as keys: coalesced loads, all in flight
        before the first use; in a partial tile from clamped positions (keys outside [lo, hi) are junk)."""
        for j in cutlass.range_constexpr(self.per_lane):
            if const_expr(full):
                rKeys[j] = gRow[base + j * 32 + lane]
            else:
                rKeys[j] = gRow[cutlass.min(cutlass.max(base + j * 32 + lane, lo), hi - 1)]
        for j in cutlass.range_constexpr(self.per_lane):
            rKeys[j] = score_to_key(bits_f32(rKeys[j]))

    @cute.jit
    def live(self, p: Int32, lo: Int32, hi: Int32, full: cutlass.Constexpr):
        if const_expr(full):
            return True
        else:
            return p >= lo and p < hi

    @cute.jit
    def hist_tile(self, gRow, sHist, base: Int32, lo: Int32, hi: Int32, lane: Int32, rKeys,
                  full: cutlass.Constexpr):
        self.load_keys(gRow, base, lo, hi, lane, rKeys, full)
        for j in cutlass.range_constexpr(self.per_lane):
            if self.live(base + j * 32 + lane, lo, hi, full):
                cute.arch.atomic_add((sHist.iterator + Int32(rKeys[j] >> Uint32(self.shift))).llvm_ptr, Int32(1))

    @cute.jit
    def count_tile(self, gRow, sHit, t: Int32, base: Int32, lo: Int32, hi: Int32, warp: Int32, lane: Int32, rKeys,
                   bin_t: Int32, full: cutlass.Constexpr) -> Int32:
        """The warp's keys above T (low 16 bits) and in T (high 16 bits), in every lane; the
        ballots of keys >= T go to sHit for the first self.hit_tiles tiles."""
        self.load_keys(gRow, base, lo, hi, lane, rKeys, full)
        packed = Int32(0)
        for j in cutlass.range_constexpr(self.per_lane):
            d = Int32(rKeys[j] >> Uint32(self.shift))
            live = self.live(base + j * 32 + lane, lo, hi, full)
            if live:
                if d > bin_t:
                    packed = packed + 1
                if d == bin_t:
                    packed = packed + (1 << 16)
            m = Uint32(cute.arch.vote_ballot_sync(live and d >= bin_t))
            if lane == 0 and t < self.hit_tiles:
                sHit[j, warp, t] = m
        for s in cutlass.range_constexpr(5):
            packed = packed + cute.arch.shuffle_sync_bfly(packed, offset=1 << s)
        return packed

    @cute.jit
    def count_tile_raw(self, gRow, sHit, t: Int32, base: Int32, warp: Int32, lane: Int32, rKeys, lo_s: Int32,
                       hi_s: Int32) -> Int32:
        """count_tile of a full tile when T's keys are non-negative scores: for those, key >= K
        exactly when the raw bits, as a signed int, are >= K ^ 2^31 (a negative score's bits are
        negative ints; -0.0 sorts below +0.0 as in the keys; NaNs as their keys do), so each key
        is two compares, with no key transform or digit. lo_s / hi_s: T's first key and the next
        bin's, so transformed ((T - bins / 2) << shift). Counts keys >= T (high half) and above
        T (low half) per lane, and returns count_tile's encoding."""
        for j in cutlass.range_constexpr(self.per_lane):
            rKeys[j] = gRow[base + j * 32 + lane]
        packed = Int32(0)
        for j in cutlass.range_constexpr(self.per_lane):
            v = Int32(rKeys[j])
            ge = v >= lo_s
            if ge:
                packed = packed + (1 << 16)
            if v >= hi_s:
                packed = packed + 1
            m = Uint32(cute.arch.vote_ballot_sync(ge))
            if lane == 0 and t < self.hit_tiles:
                sHit[j, warp, t] = m
        for s in cutlass.range_constexpr(5):
            packed = packed + cute.arch.shuffle_sync_bfly(packed, offset=1 << s)
        return packed - ((packed & Int32(0xFFFF)) << Int32(16))

    @cute.jit
    def hit_mask(self, sHit, t: Int32, warp: Int32, j: cutlass.Constexpr) -> Uint32:
        """Lanes of step j holding a key >= T (every lane past the recorded tiles)."""
        m = Uint32(0xFFFFFFFF)
        if t < self.hit_tiles:
            m = sHit[j, warp, t]
        return m

    @cute.jit
    def write_tile(self, gRow, sHit, t: Int32, base: Int32, lo: Int32, hi: Int32, warp: Int32, lane: Int32, rKeys,
                   run_gt: Int32, run_tie: Int32, args, full: cutlass.Constexpr):
        """Winners of the warp's positions to their ranks after run_gt, keys in T to the buffer
        after run_tie. Only the lanes step 2 marked load their logit."""
        mIdx, mScores, mBlockTable, mTieKey, mTiePos, row, start, physical, rows_per_req, keep_ties, bin_t = args
        for j in cutlass.range_constexpr(self.per_lane):
            if (self.hit_mask(sHit, t, warp, j) >> Uint32(lane)) & Uint32(1) != Uint32(0):
                p = base + j * 32 + lane
                if const_expr(not full):
                    p = cutlass.min(cutlass.max(p, lo), hi - 1)
                rKeys[j] = gRow[p]
        lt_mask = (Uint32(1) << Uint32(lane)) - Uint32(1)
        for j in cutlass.range_constexpr(self.per_lane):
            m = self.hit_mask(sHit, t, warp, j)
            if m != Uint32(0):
                p = base + j * 32 + lane
                key = score_to_key(bits_f32(rKeys[j]))
                d = Int32(key >> Uint32(self.shift))
                ok = (m >> Uint32(lane)) & Uint32(1) != Uint32(0) and self.live(p, lo, hi, full)
                gt = ok and d > bin_t
                tie = ok and d == bin_t
                bg = Uint32(cute.arch.vote_ballot_sync(gt))
                bt = Uint32(cute.arch.vote_ballot_sync(tie))
                if gt:
                    write_winner(mIdx, mScores, mBlockTable, row, run_gt + Int32(cute.arch.popc(bg & lt_mask)), p, start,
                                 physical, rows_per_req, key)
                if keep_ties and tie:
                    i = run_tie + Int32(cute.arch.popc(bt & lt_mask))
                    mTieKey[row, i] = Int32(key)
                    mTiePos[row, i] = p
                run_gt = run_gt + Int32(cute.arch.popc(bg))
                run_tie = run_tie + Int32(cute.arch.popc(bt))

    @cute.jit
    def block_total(self, v: Int32, sState, tidx: Int32, warp: Int32, lane: Int32) -> Int32:
        """Sum of v over the CTA, in every thread."""
        self.block_exclusive_sum(v, sState, tidx, warp, lane)
        total = Int32(0)
        for w in cutlass.range_constexpr(self.num_warps):
            total = total + sState[w]
        return total

    @cute.jit
    def threshold_bin(self, mHist, row: Int32, k: Int32, sState, tidx: Int32, warp: Int32, lane: Int32):
        """(T, keys above T, keys in T, valid keys) from the finished row histogram. T = -1 when
        the row has at most k valid keys (all of them win)."""
        per = self.hist_bins // self.num_threads
        top = self.hist_bins - 1 - per * tidx     # thread t owns bins top, top - 1, ... (descending)
        rH = cute.make_rmem_tensor((per,), Int32)
        mine = Int32(0)
        for q in cutlass.range_constexpr(per):
            rH[q] = load_gpu(mHist, row, top - q)
            mine = mine + rH[q]
        if tidx == 0:
            sState[self.num_warps + 0] = Int32(-1)
            sState[self.num_warps + 1] = Int32(0)
            sState[self.num_warps + 2] = Int32(0)
        above = self.block_exclusive_sum(mine, sState, tidx, warp, lane)   # synchronizes first
        total = Int32(0)
        for w in cutlass.range_constexpr(self.num_warps):
            total = total + sState[w]
        for q in cutlass.range_constexpr(per):
            c = rH[q]
            if above < k and above + c >= k:
                sState[self.num_warps + 0] = top - q
                sState[self.num_warps + 1] = above
                sState[self.num_warps + 2] = c
            above = above + c
        cute.arch.sync_threads()
        bin_t = sState[self.num_warps + 0]
        n_above = sState[self.num_warps + 1]
        in_t = sState[self.num_warps + 2]
        if bin_t < 0:
            n_above = total
        return bin_t, n_above, in_t, total


class WideTies(RadixSelectMixin):
    """Per row: the winners among the keys in T, then the -1 / -inf tail; grid (rows,)."""

    def __init__(self, num_threads: int, bits: int, tie_cap: int):
        """num_threads: CTA size; bits and tie_cap as WideChunk's (the histogram it left)."""
        self.num_threads = num_threads
        self.num_warps = num_threads // 32
        self.hist_bins = 1 << bits
        self.shift = 32 - bits
        self.tie_cap = tie_cap

    @cute.jit
    def __call__(self, mLogits: cute.Tensor, mStarts: cute.Tensor, mEnds: cute.Tensor, mActiveWidth: cute.Tensor,
                 mBlockTable: cute.Tensor, mHist: cute.Tensor, mCnt: cute.Tensor, mState: cute.Tensor,
                 mTieKey: cute.Tensor, mTiePos: cute.Tensor, mIdx: cute.Tensor,
                 k: Int32, ratio: Int32, has_starts: Int32, has_active_width: Int32, physical: Int32, rows_per_req: Int32,
                 tiles_per_cta: Int32, stream):
        self.launch(mLogits, mStarts, mEnds, mActiveWidth, mBlockTable, mState, mTieKey, mTiePos, mIdx, None,
                    k, ratio, has_starts, has_active_width, physical, rows_per_req, stream)

    @cute.jit
    def launch(self, mLogits, mStarts, mEnds, mActiveWidth, mBlockTable, mState, mTieKey, mTiePos, mIdx, mScores,
               k: Int32, ratio: Int32, has_starts: Int32, has_active_width: Int32, physical: Int32,
               rows_per_req: Int32, stream):
        """The kernel's launch; mScores is None without scores."""
        @cute.struct
        class SharedStorage:
            sKeys: cute.struct.Align[cute.struct.MemRange[Uint32, self.tie_cap], 16]
            sPos: cute.struct.Align[cute.struct.MemRange[Int32, self.tie_cap], 16]
            sHist: cute.struct.Align[cute.struct.MemRange[Int32, BINS], 16]
            sState: cute.struct.Align[cute.struct.MemRange[Int32, 2 * self.num_warps + 8], 16]

        self.kernel(mLogits, mStarts, mEnds, mActiveWidth, mBlockTable, mState, mTieKey, mTiePos, mIdx, mScores,
                    k, ratio, has_starts, has_active_width, physical, rows_per_req,
                    SharedStorage).launch(grid=(mIdx.shape[0], 1, 1), block=[self.num_threads, 1, 1], stream=stream,
                                          use_pdl=True)

    @cute.kernel
    def kernel(self, mLogits, mStarts, mEnds, mActiveWidth, mBlockTable, mState, mTieKey, mTiePos, mIdx, mScores,
               k: Int32, ratio: Int32, has_starts: Int32, has_active_width: Int32,
               physical: Int32, rows_per_req: Int32, SharedStorage: cutlass.Constexpr):
        # a programmatic dependent of wide_chunk: launched while its CTAs run, waits here for the
        # grid to finish (its counts, state and tie buffer complete and visible)
        cute.arch.griddepcontrol_wait()
        tidx, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = cute.arch.lane_idx()
        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        sKeys = storage.sKeys.get_tensor(cute.make_layout(self.tie_cap))
        sPos = storage.sPos.get_tensor(cute.make_layout(self.tie_cap))
        sHist = storage.sHist.get_tensor(cute.make_layout(BINS))
        sState = storage.sState.get_tensor(cute.make_layout(2 * self.num_warps + 8))
        start, end = row_bounds(mLogits, mStarts, mEnds, mActiveWidth, row, ratio, has_starts, has_active_width)
        bin_t = mState[row, 0]
        n_gt = mState[row, 1]
        n_tie = mState[row, 2]
        total = mState[row, 3]
        need = k - n_gt
        args = (row, n_gt, start, physical, rows_per_req, mBlockTable, mIdx, mScores, sPos)
        if bin_t >= 0:
            if n_tie <= self.tie_cap:
                for i in cutlass.range(tidx, n_tie, self.num_threads, unroll=1):
                    sKeys[i] = Uint32(mTieKey[row, i])
                    sPos[i] = mTiePos[row, i]
                cute.arch.sync_threads()
                prefix, mask, left = self.find_threshold(sKeys, sPos, False, False, Uint32(0), Uint32(0), Int32(0),
                                                         n_tie, n_tie, need, sHist, sState, tidx, warp, lane)
                self.emit_winners(sKeys, sPos, False, False, Uint32(0), Uint32(0), Int32(0), n_tie, n_tie, need,
                                  prefix, mask, left, sState, tidx, warp, lane, type(self).emit_buffered, args)
            else:
                # more keys in T than the tie buffer holds: select them from the row itself
                gRow = cute.recast_tensor(mLogits[row, None], Uint32)
                prefix0 = Uint32(bin_t) << Uint32(self.shift)
                mask0 = Uint32(self.hist_bins - 1) << Uint32(self.shift)
                prefix, mask, left = self.find_threshold(gRow, sPos, False, True, prefix0, mask0, start, end, n_tie,
                                                         need, sHist, sState, tidx, warp, lane)
                self.emit_winners(gRow, sPos, False, True, prefix0, mask0, start, end, n_tie, need, prefix, mask,
                                  left, sState, tidx, warp, lane, type(self).emit_in_row, args)
        for s in cutlass.range(cutlass.min(total, k) + tidx, k, self.num_threads, unroll=1):
            mIdx[row, s] = Int32(-1)
            if const_expr(mScores is not None):
                mScores[row, s] = -Float32.inf

    @cute.jit
    def emit_buffered(self, slot: Int32, i: Int32, key: Uint32, args):
        row, n_gt, start, physical, rows_per_req, mBlockTable, mIdx, mScores, sPos = args
        write_winner(mIdx, mScores, mBlockTable, row, n_gt + slot, sPos[i], start, physical, rows_per_req, key)

    @cute.jit
    def emit_in_row(self, slot: Int32, i: Int32, key: Uint32, args):
        row, n_gt, start, physical, rows_per_req, mBlockTable, mIdx, mScores, sPos = args
        write_winner(mIdx, mScores, mBlockTable, row, n_gt + slot, i, start, physical, rows_per_req, key)


class WideChunkWithScores(WideChunk):
    """WideChunk that also writes the fp32 scores of the winners."""

    @cute.jit
    def __call__(self, mLogits: cute.Tensor, mStarts: cute.Tensor, mEnds: cute.Tensor, mActiveWidth: cute.Tensor,
                 mBlockTable: cute.Tensor, mHist: cute.Tensor, mCnt: cute.Tensor, mState: cute.Tensor,
                 mTieKey: cute.Tensor, mTiePos: cute.Tensor, mIdx: cute.Tensor, mScores: cute.Tensor,
                 k: Int32, ratio: Int32, has_starts: Int32, has_active_width: Int32, physical: Int32, rows_per_req: Int32,
                 tiles_per_cta: Int32, stream):
        self.launch(mLogits, mStarts, mEnds, mActiveWidth, mBlockTable, mHist, mCnt, mState, mTieKey, mTiePos, mIdx,
                    mScores, k, ratio, has_starts, has_active_width, physical, rows_per_req, tiles_per_cta, stream)


class WideTiesWithScores(WideTies):
    """WideTies that also writes the fp32 scores (-inf in the tail)."""

    @cute.jit
    def __call__(self, mLogits: cute.Tensor, mStarts: cute.Tensor, mEnds: cute.Tensor, mActiveWidth: cute.Tensor,
                 mBlockTable: cute.Tensor, mHist: cute.Tensor, mCnt: cute.Tensor, mState: cute.Tensor,
                 mTieKey: cute.Tensor, mTiePos: cute.Tensor, mIdx: cute.Tensor, mScores: cute.Tensor,
                 k: Int32, ratio: Int32, has_starts: Int32, has_active_width: Int32, physical: Int32, rows_per_req: Int32,
                 tiles_per_cta: Int32, stream):
        self.launch(mLogits, mStarts, mEnds, mActiveWidth, mBlockTable, mState, mTieKey, mTiePos, mIdx, mScores,
                    k, ratio, has_starts, has_active_width, physical, rows_per_req, stream)


def make_wide_fakes(k_max: int, bits: int, tie_cap: int, with_scores: bool):
    """Fake arguments of WideChunk / WideTies (with_scores: of the *WithScores classes) for cute.compile."""
    hist_bins = 1 << bits
    rows = cute.sym_int32()
    kk = cute.sym_int32()
    logits = cute.runtime.make_fake_tensor(Float32, (rows, cute.sym_int32()), (cute.sym_int64(), 1), assumed_align=4)
    starts = cute.runtime.make_fake_compact_tensor(Int32, (rows,), assumed_align=4)
    ends = cute.runtime.make_fake_compact_tensor(Int32, (rows,), assumed_align=4)
    active_width = cute.runtime.make_fake_compact_tensor(Int32, (cute.sym_int32(),), assumed_align=4)
    bt = cute.runtime.make_fake_tensor(Int32, (cute.sym_int32(), cute.sym_int32()), (cute.sym_int64(), 1),
                                       assumed_align=4)
    hist = cute.runtime.make_fake_compact_tensor(Int32, (rows, hist_bins + 4), stride_order=(1, 0), assumed_align=4)
    cnt = cute.runtime.make_fake_compact_tensor(Int32, (rows, cute.sym_int32()), stride_order=(1, 0), assumed_align=4)
    state = cute.runtime.make_fake_compact_tensor(Int32, (rows, 4), stride_order=(1, 0), assumed_align=4)
    tie_key = cute.runtime.make_fake_compact_tensor(Int32, (rows, tie_cap), stride_order=(1, 0), assumed_align=4)
    tie_pos = cute.runtime.make_fake_compact_tensor(Int32, (rows, tie_cap), stride_order=(1, 0), assumed_align=4)
    idx = cute.runtime.make_fake_tensor(Int32, (rows, kk), (cute.sym_int64(), 1), assumed_align=4)
    scores = (cute.runtime.make_fake_tensor(Float32, (rows, kk), (cute.sym_int64(), 1), assumed_align=4),) \
        if with_scores else ()
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return (logits, starts, ends, active_width, bt, hist, cnt, state, tie_key, tie_pos, idx, *scores,
            Int32(k_max), Int32(1), Int32(0), Int32(0), Int32(0), Int32(1), Int32(1), stream)
