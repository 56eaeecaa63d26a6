"""Fused lightning indexer + exact top-k for small batches: one CTA per (row, chunk of entries)
scores its chunk with fp8 tensor-core MMAs straight into shared memory as sortable keys and
selects the chunk's top-k there (select.py's radix select), so the [rows, width] logits never
reach HBM. The merge stages of the top-k module (select.TopKStage over candidates) reduce the
chunk candidates to the row's top-k.

Same contracts as the paged logits and the top-k: row r holds floor(lengths[r] / ratio)
entries (lengths in tokens); the active width is the planned width, or active_width[0] from a
device buffer, in entries (not divided again). A page whose block-table entry lies outside the
cache is not read: its entries score -inf, and as physical slots they are -1.

Scores are optional as in select.py: FusedTopK compiles without them (mScores = None: no
kernel argument, no code), FusedTopKWithScores has mScores in its entry point's arguments."""
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint8, Uint32, const_expr

from .fp8_mma import HEAD_DIM, Fp8Scorer, smem_desc
from .k_pages import PAGE_SIZE, active_entries, load_page_rows
from .select import BINS, RadixSelectMixin, score_to_key, write_winner

TOKENS_PER_WARP = 16


class FusedTopK(RadixSelectMixin):
    """Score a chunk of one row into shared memory, then select its top-k (partial or final).

    final: write indices (and scores) with a -1 / -inf tail, else the chunk's candidates.
    num_heads: index heads; compress_ratio: tokens per cache entry; chunk: entries scored and
    selected per CTA; warps: per CTA, each scores 16 tokens of a page (warps x 16 / 64 pages per
    step); wgmma: score with wgmma, q[row] in shared memory as the B tile (sm_90a), else with
    mma.sync, q in registers."""

    def __init__(self, final: bool, *, num_heads: int, compress_ratio: int, chunk: int, warps: int, wgmma: bool):
        self.final = final
        self.num_threads = 32 * warps
        self.num_warps = warps
        self.source = "logits"
        self.capacity = chunk
        self.num_heads = num_heads
        self.compress_ratio = compress_ratio
        self.wgmma = wgmma
        self.scorer = Fp8Scorer(num_heads)
        self.pages_per_step = warps * TOKENS_PER_WARP // PAGE_SIZE   # pages scored per loop step
        assert chunk % PAGE_SIZE == 0 and self.pages_per_step >= 1

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,           # [rows, Hi, 128] u8 (e4m3 bits)
        mW: cute.Tensor,           # [rows, Hi] f32
        mKV: cute.Tensor,          # [blocks, 64, 132] u8
        mBlockTable: cute.Tensor,  # [requests, pages] i32
        mLengths: cute.Tensor,     # [rows] i32 tokens
        mActiveWidth: cute.Tensor, # [1] i32 entries (has_active_width != 0)
        mKeyOut: cute.Tensor,      # [rows, chunks, k] i32
        mPosOut: cute.Tensor,      # [rows, chunks, k] i32
        mCntOut: cute.Tensor,      # [rows, chunks] i32
        mIdx: cute.Tensor,         # [rows, k] i32
        k: Int32,
        width: Int32,              # planned width (graph-stable capacity)
        has_active_width: Int32,
        physical: Int32,           # 0: row-relative positions; N: physical slots of an N-page cache
        rows_per_req: Int32,
        stream,
    ):
        self.launch(mQ, mW, mKV, mBlockTable, mLengths, mActiveWidth, mKeyOut, mPosOut, mCntOut, mIdx, None, k, width,
                    has_active_width, physical, rows_per_req, stream)

    @cute.jit
    def launch(self, mQ, mW, mKV, mBlockTable, mLengths, mActiveWidth, mKeyOut, mPosOut, mCntOut, mIdx, mScores,
               k: Int32, width: Int32, has_active_width: Int32, physical: Int32, rows_per_req: Int32, stream):
        """The launch; mScores is None for a kernel without scores."""
        @cute.struct
        class SharedStorage:
            sKeys: cute.struct.Align[cute.struct.MemRange[Uint32, self.capacity], 16]
            sPos: cute.struct.Align[cute.struct.MemRange[Int32, 4], 16]
            sHist: cute.struct.Align[cute.struct.MemRange[Int32, BINS], 16]
            sState: cute.struct.Align[cute.struct.MemRange[Int32, 2 * self.num_warps + 8], 16]
            if const_expr(self.wgmma):
                sQ: cute.struct.Align[cute.struct.MemRange[Uint32, self.scorer.q_smem_words], 128]

        chunks = 1
        if const_expr(not self.final):
            chunks = mCntOut.shape[1]
        self.kernel(
            mQ, mW, mKV, mBlockTable, mLengths, mActiveWidth, mKeyOut, mPosOut, mCntOut, mIdx,
            mScores, k, width, has_active_width, physical, rows_per_req, SharedStorage,
        ).launch(grid=(mQ.shape[0], chunks, 1), block=[self.num_threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(
        self, mQ, mW, mKV, mBlockTable, mLengths, mActiveWidth, mKeyOut, mPosOut, mCntOut, mIdx,
        mScores, k: Int32, width: Int32, has_active_width: Int32, physical: Int32,
        rows_per_req: Int32, SharedStorage: cutlass.Constexpr,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        row, grp, _ = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = cute.arch.lane_idx()
        g = lane // 4
        tig = lane % 4
        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        sKeys = storage.sKeys.get_tensor(cute.make_layout(self.capacity))
        sPos = storage.sPos.get_tensor(cute.make_layout(4))
        sHist = storage.sHist.get_tensor(cute.make_layout(BINS))
        sState = storage.sState.get_tensor(cute.make_layout(2 * self.num_warps + 8))

        active = active_entries(width, mActiveWidth, has_active_width)
        end = cutlass.min(cutlass.max(mLengths[row], 0) // self.compress_ratio, active)
        req = row // rows_per_req
        base_pos = grp * self.capacity
        hi = cutlass.max(cutlass.min(end - base_pos, self.capacity), 0)
        n_valid = hi

        # ---- score the chunk's live pages into sKeys --------------------------------------
        if hi > 0:
            if const_expr(self.wgmma):
                # q[row] into shared memory as the wgmma B tile (each warpgroup scores its own pages)
                sQw = storage.sQ.get_tensor(cute.make_layout(self.scorer.q_smem_words))
                q_desc = smem_desc(sQw.iterator.toint())
                self.scorer.store_q_smem(mQ, row, sQw, tidx, self.num_threads)
                cute.arch.fence_proxy("async.shared", space="cta")
                cute.arch.sync_threads()
            else:
                rQ = cute.make_rmem_tensor((self.num_heads // 8, 8), Uint32)
                self.scorer.load_q_fragments(mQ, row, g, tig, rQ)
            rW = cute.make_rmem_tensor((self.num_heads // 8, 2), Float32)
            self.scorer.load_weights(mW, row, tig, rW)
            rK = cute.make_rmem_tensor((2, 8), Uint32)
            rS = cute.make_rmem_tensor((2,), Float32)
            rKn = cute.make_rmem_tensor((2, 8), Uint32)
            rSn = cute.make_rmem_tensor((2,), Float32)
            t_lo = (warp % (PAGE_SIZE // TOKENS_PER_WARP)) * TOKENS_PER_WARP + g
            first = base_pos // PAGE_SIZE + warp // (PAGE_SIZE // TOKENS_PER_WARP)
            n_pages = (base_pos + hi + PAGE_SIZE - 1) // PAGE_SIZE
            ok_next = self.issue_page(mKV, mBlockTable, req, first, n_pages, t_lo, tig, rKn, rSn)
            for p in cutlass.range(first, n_pages, self.pages_per_step, unroll=1):
                rK.store(rKn.load())
                rS.store(rSn.load())
                ok = ok_next
                ok_next = self.issue_page(mKV, mBlockTable, req, p + self.pages_per_step, n_pages, t_lo, tig,
                                          rKn, rSn)
                if const_expr(self.wgmma):
                    v = self.scorer.score_page_wgmma(q_desc, [rW], rK, rS, tig)
                else:
                    v = self.scorer.score_16_tokens(rQ, rW, rK, rS, tig)
                if ok == 0:
                    v = -Float32.inf          # a page outside the cache: nothing was read for it
                i = p * PAGE_SIZE + t_lo + 8 * tig - base_pos
                if tig < 2:
                    sKeys[i] = score_to_key(v)
        cute.arch.sync_threads()

        # ---- exact top-k of the chunk --------------------------------------------------------
        lo = Int32(0)
        prefix, mask, need = self.find_threshold(sKeys, sPos, False, False, Uint32(0), Uint32(0), lo, hi, n_valid, k,
                                                 sHist, sState, tidx, warp, lane)
        emit_args = (row, grp, base_pos, physical, rows_per_req, mBlockTable, mKeyOut, mPosOut, mIdx, mScores)
        self.emit_winners(sKeys, sPos, False, False, Uint32(0), Uint32(0), lo, hi, n_valid, k, prefix, mask, need,
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
    def issue_page(self, mKV, mBlockTable, req, p, n_pages, t_lo, tig, rK, rS) -> Int32:
        """Loads of page p's rows t_lo, t_lo + 8 (and scales); nothing past the row's last page, and
        nothing for a block-table entry outside [0, blocks): then 0 is returned (1 otherwise),
        and the page's scores become -inf. On wgmma the rows keep the dims in memory order, as
        the logits kernel's shared-memory operand has them (k_pages.load_page_rows)."""
        ok = Int32(1)
        if p < n_pages:
            ok = load_page_rows(mKV, mBlockTable[req, p], t_lo, tig, rK, rS, self.wgmma)
        return ok

    @cute.jit
    def emit_one(self, slot: Int32, i: Int32, key: Uint32, args):
        row, grp, base_pos, physical, rows_per_req, mBlockTable, mKeyOut, mPosOut, mIdx, mScores = args
        pos = base_pos + i
        if const_expr(self.final):
            write_winner(mIdx, mScores, mBlockTable, row, slot, pos, Int32(0), physical, rows_per_req, key)
        else:
            mKeyOut[row, grp, slot] = Int32(key)
            mPosOut[row, grp, slot] = pos


class FusedTopKWithScores(FusedTopK):
    """FusedTopK that also writes the fp32 scores of the winners (-inf in the tail)."""

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,
        mW: cute.Tensor,
        mKV: cute.Tensor,
        mBlockTable: cute.Tensor,
        mLengths: cute.Tensor,
        mActiveWidth: cute.Tensor,
        mKeyOut: cute.Tensor,
        mPosOut: cute.Tensor,
        mCntOut: cute.Tensor,
        mIdx: cute.Tensor,
        mScores: cute.Tensor,      # [rows, k] f32
        k: Int32,
        width: Int32,
        has_active_width: Int32,
        physical: Int32,
        rows_per_req: Int32,
        stream,
    ):
        self.launch(mQ, mW, mKV, mBlockTable, mLengths, mActiveWidth, mKeyOut, mPosOut, mCntOut, mIdx, mScores, k,
                    width, has_active_width, physical, rows_per_req, stream)


def make_fused_fakes(num_heads: int, k_max: int, chunk: int, with_scores: bool):
    """Fake arguments of a FusedTopK (with_scores: of a FusedTopKWithScores) for cute.compile."""
    rows = cute.sym_int32()
    chunks = cute.sym_int32()
    kk = cute.sym_int32()
    q = cute.runtime.make_fake_compact_tensor(Uint8, (rows, num_heads, HEAD_DIM), stride_order=(2, 1, 0),
                                              assumed_align=16)
    w = cute.runtime.make_fake_compact_tensor(Float32, (rows, num_heads), stride_order=(1, 0), assumed_align=16)
    kv = cute.runtime.make_fake_tensor(Uint8, (cute.sym_int32(), PAGE_SIZE, HEAD_DIM + 4),
                                       (cute.sym_int64(divisibility=16), HEAD_DIM + 4, 1), assumed_align=16)
    bt = cute.runtime.make_fake_tensor(Int32, (cute.sym_int32(), cute.sym_int32()), (cute.sym_int64(), 1),
                                       assumed_align=4)
    lengths = cute.runtime.make_fake_compact_tensor(Int32, (rows,), assumed_align=4)
    active_width = cute.runtime.make_fake_compact_tensor(Int32, (cute.sym_int32(),), assumed_align=4)
    key_out = cute.runtime.make_fake_compact_tensor(Int32, (rows, chunks, kk), stride_order=(2, 1, 0), assumed_align=4)
    pos_out = cute.runtime.make_fake_compact_tensor(Int32, (rows, chunks, kk), stride_order=(2, 1, 0), assumed_align=4)
    cnt_out = cute.runtime.make_fake_compact_tensor(Int32, (rows, chunks), stride_order=(1, 0), assumed_align=4)
    idx = cute.runtime.make_fake_tensor(Int32, (rows, kk), (cute.sym_int64(), 1), assumed_align=4)
    scores = (cute.runtime.make_fake_tensor(Float32, (rows, kk), (cute.sym_int64(), 1), assumed_align=4),) \
        if with_scores else ()
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return (q, w, kv, bt, lengths, active_width, key_out, pos_out, cnt_out, idx, *scores,
            Int32(k_max), Int32(chunk), Int32(0), Int32(0), Int32(1), stream)
