"""Exact top-k by radix select in shared memory: sortable u32 keys, the block-wide radix select,
the output writes, and TopKStage (a CTA per row: first stage over logits, or merge over candidates).

Written once here and imported by the generated top-k and fused-indexer modules. Scores are
optional everywhere: a stage compiled without them takes mScores = None (no kernel argument, no
code); TopKStageWithScores is the same kernel with mScores in its entry point's arguments."""
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from ..scan import block_exclusive_sum

# Scores become order-preserving u32 keys (flip all bits of negatives, the sign bit of the rest),
# so "larger score" is "larger key". Three histogram passes over 11/11/10-bit digits find the
# threshold key T and how many of the keys equal to T are still needed; one more pass writes the
# winners. Warp w owns a contiguous slice of the elements and the warps are ranked in order, so
# winners are written in position order: the output is deterministic run to run, and ties at T
# (equal scores) go to the lowest positions.
SIGN = 0x80000000
BINS = 2048                         # 11-bit digits (codegen.indexer_specs.topk_tiling's bins)
PAGE_SIZE = 64                      # physical slot = block_table[page] * 64 + offset
GROUP = 8                           # logits per group of the grouped top-k (group_select.py)
DIGIT_SHIFT = (21, 10, 0)
DIGIT_MASK = (0x7FF, 0x7FF, 0x3FF)


@dsl_user_op
def f32_bits(x: Float32, *, loc=None, ip=None) -> Uint32:
    return Uint32(llvm.bitcast(T.i32(), Float32(x).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


@dsl_user_op
def bits_f32(x: Uint32, *, loc=None, ip=None) -> Float32:
    return Float32(llvm.bitcast(T.f32(), Uint32(x).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


@cute.jit
def score_to_key(x: Float32) -> Uint32:
    b = f32_bits(x)
    # negatives: flip every bit (arithmetic shift of the sign); the rest: set the sign bit
    return b ^ (Uint32(Int32(b) >> Int32(31)) | Uint32(SIGN))


@cute.jit
def key_to_score(key: Uint32) -> Float32:
    b = ~key
    if (key & Uint32(SIGN)) != Uint32(0):
        b = key ^ Uint32(SIGN)
    return bits_f32(b)


@cute.jit
def key_at(src, i, raw: cutlass.Constexpr) -> Uint32:
    """Key i of `src`: u32 keys in shared memory, or (raw) a row of f32 logits in global memory."""
    key = Uint32(src[i])
    if const_expr(raw):
        key = score_to_key(bits_f32(key))
    return key


@cute.jit
def write_winner(mIdx, mScores, mBlockTable, row: Int32, slot: Int32, pos: Int32, start: Int32,
                 physical: Int32, rows_per_req: Int32, key: Uint32):
    """Output slot `slot` of `row`: the row-relative position (physical = 0) or its physical slot
    through the request's block table, whose entries must lie in [0, physical), the cache's pages
    (physical <= 2^25 keeps every slot within int32): -1 for any other entry, one unsigned compare
    that also catches the negative ones; and the score unless mScores is None."""
    out = pos - start
    if physical != 0:
        page = pos // PAGE_SIZE
        blk = mBlockTable[row // rows_per_req, page]
        out = Int32(-1)
        if Uint32(blk) < Uint32(physical):
            out = blk * PAGE_SIZE + (pos - page * PAGE_SIZE)
    mIdx[row, slot] = out
    if const_expr(mScores is not None):
        mScores[row, slot] = key_to_score(key)


@cute.jit
def first_group(start: Int32, end: Int32) -> Int32:
    """The group of the grouped top-k's maxima row 0: the one that holds `start` (clamped to
    `end`, so that a caller's start past the row keeps every group's position in range)."""
    return cutlass.min(start, end) // GROUP


@cute.jit
def row_bounds(mLogits, mStarts, mEnds, mActiveWidth, row: Int32, ratio: Int32, has_starts: Int32,
               has_active_width: Int32):
    """[start, end) of the row's valid positions (entries): end = ends[row] // ratio (ends count
    tokens), clipped to the active width. That is the logits width, or the device buffer's value,
    which is already in entries (the unit of the decode-metadata helper), so it is not divided."""
    width = mLogits.shape[1]
    if has_active_width != 0:
        width = cutlass.min(width, cutlass.max(mActiveWidth[0], 0))
    start = Int32(0)
    if has_starts != 0:
        start = cutlass.max(mStarts[row], 0)
    end = cutlass.min(cutlass.max(mEnds[row], 0) // ratio, width)
    return start, end


class RadixSelectMixin:
    """Block-wide exact top-k over keys in shared memory. Needs self.num_threads, self.num_warps.

    Elements are indices [lo, hi) of sKeys; with sPos (merge stages), an element is valid only when
    its position is >= 0. raw: sKeys is a row of f32 logits in global memory (keys made on read).
    Only keys with key & mask0 == prefix0 take part (mask0 = 0: all of them).
    emit(slot, i, key) is called for each winner with its output slot."""

    @cute.jit
    def warp_range(self, lo: Int32, hi: Int32, warp: Int32):
        """Contiguous slice of [lo, hi) owned by `warp`, in whole 32-element steps."""
        n = cutlass.max(hi - lo, 0)
        seg = ((n + self.num_warps - 1) // self.num_warps + 31) // 32 * 32
        w_lo = lo + warp * seg
        w_hi = cutlass.min(w_lo + seg, hi)
        return w_lo, w_hi

    @cute.jit
    def find_threshold(self, sKeys, sPos, has_pos: cutlass.Constexpr, raw: cutlass.Constexpr, prefix0: Uint32,
                       mask0: Uint32, lo: Int32, hi: Int32, n_valid: Int32, k: Int32, sHist, sState, tidx: Int32,
                       warp: Int32, lane: Int32):
        """Returns (prefix, mask, need): winners are the valid keys with key & mask > prefix, plus
        the first `need` (by position) with key & mask == prefix. n_valid <= k selects everything."""
        prefix = prefix0
        mask = mask0
        need = k
        done = n_valid <= k
        w_lo, w_hi = self.warp_range(lo, hi, warp)
        for p in cutlass.range_constexpr(3):
            if not done:
                shift = DIGIT_SHIFT[p]
                for b in cutlass.range(tidx, BINS, self.num_threads, unroll=1):
                    sHist[b] = Int32(0)
                cute.arch.sync_threads()
                for i in cutlass.range(w_lo + lane, w_hi, 32, unroll=1):
                    key = key_at(sKeys, i, raw)
                    ok = (key & mask) == prefix
                    if const_expr(has_pos):
                        ok = ok and sPos[i] >= 0
                    if ok:
                        d = Int32((key >> shift) & Uint32(DIGIT_MASK[p]))
                        cute.arch.atomic_add((sHist.iterator + d).llvm_ptr, Int32(1))
                cute.arch.sync_threads()
                # thread t owns bins BINS-1-PER*t .. BINS-PER*(t+1): a descending scan finds the
                # digit where the count of larger keys first reaches `need`
                per = BINS // self.num_threads
                top = BINS - 1 - per * tidx
                mine = Int32(0)
                for q in cutlass.range_constexpr(per):
                    mine = mine + sHist[top - q]
                above = self.block_exclusive_sum(mine, sState, tidx, warp, lane)
                for q in cutlass.range_constexpr(per):
                    c = sHist[top - q]
                    if above < need and above + c >= need:
                        sState[self.num_warps + 0] = top - q
                        sState[self.num_warps + 1] = above
                        sState[self.num_warps + 2] = c
                    above = above + c
                cute.arch.sync_threads()
                digit = sState[self.num_warps + 0]
                prefix = prefix | (Uint32(digit) << shift)
                mask = mask | (Uint32(DIGIT_MASK[p]) << shift)
                need = need - sState[self.num_warps + 1]
                done = sState[self.num_warps + 2] == need
        return prefix, mask, need

    @cute.jit
    def block_exclusive_sum(self, v: Int32, sState, tidx: Int32, warp: Int32, lane: Int32) -> Int32:
        """Exclusive prefix sum of v over the CTA in thread order (sState[0:num_warps] as scratch,
        which a previous scan may still be reading)."""
        return block_exclusive_sum(v, sState, warp, lane, self.num_warps, True)

    @cute.jit
    def emit_winners(self, sKeys, sPos, has_pos: cutlass.Constexpr, raw: cutlass.Constexpr, prefix0: Uint32,
                     mask0: Uint32, lo: Int32, hi: Int32, n_valid: Int32, k: Int32, prefix: Uint32, mask: Uint32,
                     need: Int32, sState, tidx: Int32, warp: Int32, lane: Int32, emit_fn: cutlass.Constexpr,
                     emit_args):
        """Write the winners in position order: slot = (#greater before) + min(#ties before, need)."""
        take_all = n_valid <= k
        w_lo, w_hi = self.warp_range(lo, hi, warp)
        lt_mask = (Uint32(1) << Uint32(lane)) - Uint32(1)
        n_gt = Int32(0)
        n_tie = Int32(0)
        for base in cutlass.range(w_lo, w_hi, 32, unroll=1):
            gt, tie = self.classify(sKeys, sPos, has_pos, raw, prefix0, mask0, base + lane, w_hi, take_all,
                                    prefix, mask)
            n_gt = n_gt + cute.arch.popc(cute.arch.vote_ballot_sync(gt))
            n_tie = n_tie + cute.arch.popc(cute.arch.vote_ballot_sync(tie))
        cute.arch.sync_threads()
        if lane == 0:
            sState[warp] = n_gt
            sState[self.num_warps + 4 + warp] = n_tie
        cute.arch.sync_threads()
        run_gt = Int32(0)
        run_tie = Int32(0)
        for w in cutlass.range_constexpr(self.num_warps):
            if w < warp:
                run_gt = run_gt + sState[w]
                run_tie = run_tie + sState[self.num_warps + 4 + w]
        for base in cutlass.range(w_lo, w_hi, 32, unroll=1):
            i = base + lane
            gt, tie = self.classify(sKeys, sPos, has_pos, raw, prefix0, mask0, i, w_hi, take_all, prefix, mask)
            bg = Uint32(cute.arch.vote_ballot_sync(gt))
            bt = Uint32(cute.arch.vote_ballot_sync(tie))
            gt_before = run_gt + Int32(cute.arch.popc(bg & lt_mask))
            tie_before = run_tie + Int32(cute.arch.popc(bt & lt_mask))
            if gt or (tie and tie_before < need):
                emit_fn(self, gt_before + cutlass.min(tie_before, need), i, key_at(sKeys, i, raw), emit_args)
            run_gt = run_gt + Int32(cute.arch.popc(bg))
            run_tie = run_tie + Int32(cute.arch.popc(bt))

    @cute.jit
    def classify(self, sKeys, sPos, has_pos: cutlass.Constexpr, raw: cutlass.Constexpr, prefix0: Uint32,
                 mask0: Uint32, i: Int32, end: Int32, take_all, prefix: Uint32, mask: Uint32):
        gt = False
        tie = False
        if i < end:
            key = key_at(sKeys, i, raw)
            ok = (key & mask0) == prefix0
            if const_expr(has_pos):
                ok = ok and sPos[i] >= 0
            if ok:
                if take_all:
                    gt = True
                else:
                    m = key & mask
                    gt = m > prefix
                    tie = m == prefix
        return gt, tie


class TopKStage(RadixSelectMixin):
    """One top-k stage: a CTA per (row, output group) selects from its inputs in shared memory.

    source "logits":     inputs are `capacity` consecutive logits of the row (first stage);
    source "candidates": inputs are fan_in groups of earlier (key, position, count) candidates;
    source "groups":     inputs are the GROUP logits at each of the k group ids in mPosIn[row, 0]
                         (ascending, a -1 tail), the row's valid positions among them (the second
                         step of the grouped top-k, group_select.py).
    final:               write indices (and scores) with a -1 / -inf tail, else the next candidates."""

    def __init__(self, source: str, final: bool, num_threads: int, capacity: int):
        self.source = source
        self.final = final
        self.num_threads = num_threads
        self.num_warps = num_threads // 32
        self.capacity = capacity

    @cute.jit
    def __call__(
        self,
        mLogits: cute.Tensor,      # [rows, width] f32 (first stage), row stride >= width
        mStarts: cute.Tensor,      # [rows] i32 first valid position (has_starts != 0)
        mEnds: cute.Tensor,        # [rows] i32 end of the row in tokens, divided by `ratio`
        mActiveWidth: cute.Tensor, # [1] i32: active width in entries (has_active_width != 0)
        mBlockTable: cute.Tensor,  # [requests, pages] i32 (physical != 0)
        mKeyIn: cute.Tensor,       # [rows, groups_in, k] i32 (u32 key bits)
        mPosIn: cute.Tensor,       # [rows, groups_in, k] i32
        mCntIn: cute.Tensor,       # [rows, groups_in] i32
        mKeyOut: cute.Tensor,      # [rows, groups_out, k] i32
        mPosOut: cute.Tensor,      # [rows, groups_out, k] i32
        mCntOut: cute.Tensor,      # [rows, groups_out] i32
        mIdx: cute.Tensor,         # [rows, k] i32
        k: Int32,
        ratio: Int32,
        has_starts: Int32,
        has_active_width: Int32,
        physical: Int32,           # 0: row-relative positions; N: physical slots of an N-page cache
        rows_per_req: Int32,
        fan_in: Int32,
        stream,
    ):
        self.launch(mLogits, mStarts, mEnds, mActiveWidth, mBlockTable, mKeyIn, mPosIn, mCntIn, mKeyOut, mPosOut,
                    mCntOut, mIdx, None, k, ratio, has_starts, has_active_width, physical, rows_per_req, fan_in, stream)

    @cute.jit
    def launch(self, mLogits, mStarts, mEnds, mActiveWidth, mBlockTable, mKeyIn, mPosIn, mCntIn, mKeyOut, mPosOut,
               mCntOut, mIdx, mScores, k: Int32, ratio: Int32, has_starts: Int32, has_active_width: Int32,
               physical: Int32, rows_per_req: Int32, fan_in: Int32, stream):
        """The stage's launch; mScores is None for a stage without scores."""
        @cute.struct
        class SharedStorage:
            sKeys: cute.struct.Align[cute.struct.MemRange[Uint32, self.capacity], 16]
            sPos: cute.struct.Align[cute.struct.MemRange[Int32, self.capacity if self.source != "logits" else 4], 16]
            sHist: cute.struct.Align[cute.struct.MemRange[Int32, BINS], 16]
            sState: cute.struct.Align[cute.struct.MemRange[Int32, 2 * self.num_warps + 8], 16]

        groups = 1
        if const_expr(not self.final):
            groups = mCntOut.shape[1]
        self.kernel(
            mLogits, mStarts, mEnds, mActiveWidth, mBlockTable, mKeyIn, mPosIn, mCntIn, mKeyOut, mPosOut, mCntOut,
            mIdx, mScores, k, ratio, has_starts, has_active_width, physical, rows_per_req,
            fan_in, SharedStorage,
        ).launch(grid=(mIdx.shape[0], groups, 1), block=[self.num_threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(
        self, mLogits, mStarts, mEnds, mActiveWidth, mBlockTable, mKeyIn, mPosIn, mCntIn, mKeyOut, mPosOut, mCntOut,
        mIdx, mScores, k: Int32, ratio: Int32, has_starts: Int32, has_active_width: Int32,
        physical: Int32, rows_per_req: Int32, fan_in: Int32, SharedStorage: cutlass.Constexpr,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        row, grp, _ = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = cute.arch.lane_idx()
        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        sKeys = storage.sKeys.get_tensor(cute.make_layout(self.capacity))
        sPos = storage.sPos.get_tensor(cute.make_layout(self.capacity if self.source != "logits" else 4))
        sHist = storage.sHist.get_tensor(cute.make_layout(BINS))
        sState = storage.sState.get_tensor(cute.make_layout(2 * self.num_warps + 8))

        start, end = row_bounds(mLogits, mStarts, mEnds, mActiveWidth, row, ratio, has_starts, has_active_width)
        lo = Int32(0)
        hi = Int32(0)
        n_valid = Int32(0)
        base_pos = Int32(0)
        if const_expr(self.source == "logits"):
            # this CTA's chunk of the row, clipped to the row's valid range and the active width
            base_pos = grp * self.capacity
            lo = cutlass.max(start - base_pos, 0)
            hi = cutlass.max(cutlass.min(end - base_pos, self.capacity), lo)
            n_valid = hi - lo
            if hi > lo:
                gRow = cute.recast_tensor(mLogits[row, None], Uint32)
                # Branch-free loads from clamped (always valid) positions, all issued before the
                # first use: CAPACITY / THREADS loads in flight per thread. Keys outside [lo, hi)
                # are junk and never looked at.
                per = self.capacity // self.num_threads
                rBits = cute.make_rmem_tensor((per,), Uint32)
                for j in cutlass.range_constexpr(per):
                    i = cutlass.min(cutlass.max(j * self.num_threads + tidx, lo), hi - 1)
                    rBits[j] = gRow[base_pos + i]
                for j in cutlass.range_constexpr(per):
                    sKeys[j * self.num_threads + tidx] = self.bits_to_key(rBits[j])
        elif const_expr(self.source == "groups"):
            lo, hi, n_valid = self.load_groups(mLogits, mPosIn, row, start, end, k, sKeys, sPos, sState, tidx, warp,
                                               lane)
        else:
            # fan_in groups of candidates side by side: group q at [q k, q k + count)
            g0 = grp * fan_in
            n_groups = cutlass.min(fan_in, mCntIn.shape[1] - g0)
            hi = n_groups * k
            for q in cutlass.range(n_groups, unroll=1):
                n_valid = n_valid + mCntIn[row, g0 + q]
            if hi > 0:
                # Unrolled, branch-free loads (clamped to the last live entry) so that all of them
                # are in flight at once; entries past a group's count become position -1.
                per = self.capacity // self.num_threads
                rKey = cute.make_rmem_tensor((per,), Int32)
                rPos = cute.make_rmem_tensor((per,), Int32)
                rLive = cute.make_rmem_tensor((per,), Int32)
                for j in cutlass.range_constexpr(per):
                    i = j * self.num_threads + tidx
                    ic = cutlass.min(i, hi - 1)
                    q = ic // k
                    e = ic - q * k
                    rKey[j] = mKeyIn[row, g0 + q, e]
                    rPos[j] = mPosIn[row, g0 + q, e]
                    rLive[j] = Int32(i < hi and e < mCntIn[row, g0 + q])
                for j in cutlass.range_constexpr(per):
                    i = j * self.num_threads + tidx
                    sKeys[i] = Uint32(rKey[j])
                    sPos[i] = rPos[j] if rLive[j] != 0 else Int32(-1)
        cute.arch.sync_threads()

        has_pos = self.source != "logits"
        prefix, mask, need = self.find_threshold(sKeys, sPos, has_pos, False, Uint32(0), Uint32(0), lo, hi, n_valid,
                                                 k, sHist, sState, tidx, warp, lane)
        emit_args = (row, grp, base_pos, start, physical, rows_per_req, mBlockTable, mKeyOut, mPosOut, mIdx, mScores, sPos)
        self.emit_winners(sKeys, sPos, has_pos, False, Uint32(0), Uint32(0), lo, hi, n_valid, k, prefix, mask, need,
                          sState, tidx, warp, lane, type(self).emit_one, emit_args)
        n_sel = cutlass.min(n_valid, k)
        if const_expr(self.final):
            for s in cutlass.range(n_sel + tidx, k, self.num_threads, unroll=1):
                mIdx[row, s] = Int32(-1)
                if const_expr(mScores is not None):
                    mScores[row, s] = -Float32.inf
        else:
            if tidx == 0:
                mCntOut[row, grp] = n_sel

    @cute.jit
    def load_groups(self, mLogits, mGroups, row: Int32, start: Int32, end: Int32, k: Int32, sKeys, sPos, sState,
                    tidx: Int32, warp: Int32, lane: Int32):
        """Element i = (group i // GROUP of mGroups[row, 0], entry i % GROUP): the logit at position
        (first + gid) GROUP + i % GROUP, first = first_group(start, end) (the ids are of the maxima
        row, which starts there: group_select.py), valid where gid >= 0 and the position lies in
        [start, end). The ids ascend (one CTA a row selected them), so elements are in position
        order and ties go to the lowest positions, as over the whole row. Returns (lo, hi,
        n_valid); invalid elements get position -1. Branch-free loads from clamped (always valid)
        positions, all issued before the first use."""
        hi = cutlass.min(k * GROUP, self.capacity)
        if end <= start:
            hi = Int32(0)
        mine = Int32(0)
        if hi > 0:
            gRow = cute.recast_tensor(mLogits[row, None], Uint32)
            first = first_group(start, end)
            per = self.capacity // self.num_threads
            rBits = cute.make_rmem_tensor((per,), Uint32)
            rPos = cute.make_rmem_tensor((per,), Int32)
            for j in cutlass.range_constexpr(per):
                i = j * self.num_threads + tidx
                ic = cutlass.min(i, hi - 1)
                gid = mGroups[row, 0, ic // GROUP]
                pos = (first + gid) * GROUP + (ic - (ic // GROUP) * GROUP)
                ok = i < hi and gid >= 0 and pos >= start and pos < end
                rPos[j] = pos if ok else Int32(-1)
                rBits[j] = gRow[cutlass.min(cutlass.max(pos, start), end - 1)]
            for j in cutlass.range_constexpr(per):
                i = j * self.num_threads + tidx
                sKeys[i] = self.bits_to_key(rBits[j])
                sPos[i] = rPos[j]
                mine = mine + Int32(rPos[j] >= 0)
        # n_valid: the CTA's count of valid elements (sState[num_warps + 3]: not used by the select)
        before = self.block_exclusive_sum(mine, sState, tidx, warp, lane)
        if tidx == self.num_threads - 1:
            sState[self.num_warps + 3] = before + mine
        cute.arch.sync_threads()
        return Int32(0), hi, sState[self.num_warps + 3]

    @cute.jit
    def bits_to_key(self, b: Uint32) -> Uint32:
        return score_to_key(bits_f32(b))

    @cute.jit
    def emit_one(self, slot: Int32, i: Int32, key: Uint32, args):
        row, grp, base_pos, start, physical, rows_per_req, mBlockTable, mKeyOut, mPosOut, mIdx, mScores, sPos = args
        pos = base_pos + i
        if const_expr(self.source != "logits"):
            pos = sPos[i]
        if const_expr(self.final):
            write_winner(mIdx, mScores, mBlockTable, row, slot, pos, start, physical, rows_per_req, key)
        else:
            mKeyOut[row, grp, slot] = Int32(key)
            mPosOut[row, grp, slot] = pos


class TopKStageWithScores(TopKStage):
    """TopKStage that also writes the fp32 scores of the winners (-inf in the tail)."""

    @cute.jit
    def __call__(
        self,
        mLogits: cute.Tensor,
        mStarts: cute.Tensor,
        mEnds: cute.Tensor,
        mActiveWidth: cute.Tensor,
        mBlockTable: cute.Tensor,
        mKeyIn: cute.Tensor,
        mPosIn: cute.Tensor,
        mCntIn: cute.Tensor,
        mKeyOut: cute.Tensor,
        mPosOut: cute.Tensor,
        mCntOut: cute.Tensor,
        mIdx: cute.Tensor,
        mScores: cute.Tensor,      # [rows, k] f32
        k: Int32,
        ratio: Int32,
        has_starts: Int32,
        has_active_width: Int32,
        physical: Int32,
        rows_per_req: Int32,
        fan_in: Int32,
        stream,
    ):
        self.launch(mLogits, mStarts, mEnds, mActiveWidth, mBlockTable, mKeyIn, mPosIn, mCntIn, mKeyOut, mPosOut,
                    mCntOut, mIdx, mScores, k, ratio, has_starts, has_active_width, physical, rows_per_req, fan_in,
                    stream)


def make_stage_fakes(k_max: int, with_scores: bool):
    """Fake arguments of a TopKStage (with_scores: of a TopKStageWithScores) for cute.compile."""
    rows = cute.sym_int32()
    g_in = cute.sym_int32()
    g_out = cute.sym_int32()
    kk = cute.sym_int32()
    logits = cute.runtime.make_fake_tensor(Float32, (rows, cute.sym_int32()), (cute.sym_int64(), 1), assumed_align=4)
    starts = cute.runtime.make_fake_compact_tensor(Int32, (rows,), assumed_align=4)
    ends = cute.runtime.make_fake_compact_tensor(Int32, (rows,), assumed_align=4)
    active_width = cute.runtime.make_fake_compact_tensor(Int32, (cute.sym_int32(),), assumed_align=4)
    bt = cute.runtime.make_fake_tensor(Int32, (cute.sym_int32(), cute.sym_int32()), (cute.sym_int64(), 1),
                                       assumed_align=4)
    key_in = cute.runtime.make_fake_compact_tensor(Int32, (rows, g_in, kk), stride_order=(2, 1, 0), assumed_align=4)
    pos_in = cute.runtime.make_fake_compact_tensor(Int32, (rows, g_in, kk), stride_order=(2, 1, 0), assumed_align=4)
    cnt_in = cute.runtime.make_fake_compact_tensor(Int32, (rows, g_in), stride_order=(1, 0), assumed_align=4)
    key_out = cute.runtime.make_fake_compact_tensor(Int32, (rows, g_out, kk), stride_order=(2, 1, 0), assumed_align=4)
    pos_out = cute.runtime.make_fake_compact_tensor(Int32, (rows, g_out, kk), stride_order=(2, 1, 0), assumed_align=4)
    cnt_out = cute.runtime.make_fake_compact_tensor(Int32, (rows, g_out), stride_order=(1, 0), assumed_align=4)
    idx = cute.runtime.make_fake_tensor(Int32, (rows, kk), (cute.sym_int64(), 1), assumed_align=4)
    scores = (cute.runtime.make_fake_tensor(Float32, (rows, kk), (cute.sym_int64(), 1), assumed_align=4),) \
        if with_scores else ()
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return (logits, starts, ends, active_width, bt, key_in, pos_in, cnt_in, key_out, pos_out, cnt_out, idx,
            *scores, Int32(k_max), Int32(1), Int32(0), Int32(0), Int32(0), Int32(1), Int32(1), stream)
