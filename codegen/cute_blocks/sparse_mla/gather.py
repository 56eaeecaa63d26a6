"""Gathering the KV rows named by the indices into shared memory: the cache bound, the
indices of a tile, 64-bit record addressing, the bias of masked tokens, and the gather forms
(bf16 rows by cp.async; fp8 records through registers, one tile ahead, optionally by a producer
warpgroup). The raw shared-memory form is in gather_raw.py, two index lists in two_lists.py."""
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Int64, Uint32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from .barriers import BAR_EMPTY, BAR_FULL, named_arrive, named_sync
from .kv_format import Fp8DsMlaDequant, Model1Dequant


@dsl_user_op
def ld_global_nc(addr, n: int, *, loc=None, ip=None):
    """n (1, 2 or 4) 32-bit words from a global byte address aligned to 4 n, by the read-only
    path (ld.global.nc): records and indices are never written while a kernel reads them."""
    vec = {1: "", 2: ".v2", 4: ".v4"}[n]
    outs = "{" + ", ".join(f"${i}" for i in range(n)) + "}" if n > 1 else "$0"
    text = f"ld.global.nc{vec}.u32 {outs}, [${n}];"
    ret = T.i32() if n == 1 else llvm.StructType.get_literal([T.i32()] * n)
    res = llvm.inline_asm(ret, [Int64(addr).ir_value(loc=loc, ip=ip)], text, ",".join(["=r"] * n) + ",l",
                          has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)
    if n == 1:
        return [Uint32(res)]
    return [Uint32(llvm.extractvalue(T.i32(), res, [i], loc=loc, ip=ip)) for i in range(n)]


class GatherRows:
    """What every gather form shares. Config (attributes of the kernel): tile_tokens, page_size."""

    paired_rows = False    # one token row per 8 gather threads (kernel.gather_copies)

    def cache_slots(self, mKV: cute.Tensor) -> Uint32:
        """Token slots of the cache tensor passed: its blocks (a runtime dim; a page-strided view
        counts its own) times the page size. The max(.., 0) also turns the shape's scalar into
        a plain value: a CuTe shape scalar always compares signed (it takes over the compare as
        the right operand), and the bound check must compare unsigned."""
        return Uint32(cutlass.max(mKV.shape[0], 0)) * Uint32(self.page_size)

    def live_slot(self, slot: Int32, n_slots: Uint32):
        """Whether a slot from index_at is read: one unsigned compare masks -1, every other
        negative index and every index past the cache alike. It is made where the slot becomes
        an address or a bias, not where the index is loaded, so the index load is not waited on
        a tile early (that would expose its latency on every row the producer refills)."""
        return Uint32(slot) < n_slots

    def tile_slots(self, n_slots, tok_begin, tok_end, tile):
        """The cache bound for the rows of `tile` (what live_slot compares with): one list has one
        bound; TwoLists picks the bound of the list the tile is in."""
        return n_slots

    def row_width(self, mIdx):
        """Entries of a row of the index list(s)."""
        return mIdx.shape[1]

    @cute.jit
    def load_indices(self, mIdx, row, tok_begin, tile, tok_end, tKcK, rIdx):
        """Indices of `tile` for this thread's gather rows; -1 past the split end."""
        for m in cutlass.range_constexpr(cute.size(rIdx)):
            rIdx[m] = self.index_at(mIdx, row, tok_begin, tile, tok_end, tKcK[0, m, 0][0])

    @cute.jit
    def index_at(self, mIdx, row, tok_begin, tile, tok_end, tok) -> Int32:
        """Index of token `tok` of `tile` (a gather row's tKcK[0, m, 0][0]) as the caller wrote
        it; -1 past the split end. It only becomes an address or a bias behind live_slot (the
        cache bound)."""
        pos = tok_begin + tile * self.tile_tokens + tok
        slot = Int32(-1)
        if pos < tok_end:
            slot = mIdx[row, pos]
        return slot

    @cute.jit
    def row_address(self, mKV: cute.Tensor, slot: Int32, record_bytes: cutlass.Constexpr,
                    page: cutlass.Constexpr = None) -> Int64:
        """64-bit byte address of a token record: base + (slot // P) * S_blk + (slot % P) * record,
        P the cache's page (default: page_size)."""
        if const_expr(page is None):
            page = self.page_size
        elem_bytes = mKV.element_type.width // 8
        blk = Int64(slot // page)
        off = Int64(slot % page)
        base = mKV.iterator.toint()
        return base + (blk * Int64(mKV.stride[0]) * elem_bytes) + off * record_bytes

    def live_row_address(self, mKV: cute.Tensor, slot: Int32, record_bytes: cutlass.Constexpr) -> Int64:
        """row_address of a slot that live_slot passed (0 <= slot < the cache's slots): unsigned
        page arithmetic, a shift and a mask instead of row_address's signed division."""
        u = Uint32(slot)
        page_bytes = Int64(mKV.stride[0]) * (mKV.element_type.width // 8)
        return mKV.iterator.toint() + Int64(u // self.page_size) * page_bytes + Int64((u % self.page_size) * record_bytes)

    def index_row(self, mIdx: cute.Tensor, row) -> Int64:
        """The address of row `row` of the index list (int32, unit stride, as bind checks), for a
        reader that keeps it in a register: index_at_row is the only one."""
        return mIdx[row, None].iterator.toint()

    @cute.jit
    def index_at_row(self, idx_row: Int64, pos, tok_end) -> Int32:
        """index_at through the row's address (index_row): the entry at position pos, -1 at or
        past tok_end. Like index_at's, the slot becomes an address only behind live_slot."""
        slot = Int32(-1)
        if pos < tok_end:
            slot = Int32(ld_global_nc(idx_row + Int64(pos) * 4, 1)[0])
        return slot

    def gmem_vec(self, addr: Int64, dtype, n: int, align: int = 16) -> cute.Tensor:
        """n elements of dtype at an `align`-byte aligned global byte address (a gathered record)."""
        return cute.make_tensor(cute.make_ptr(dtype, addr, cute.AddressSpace.gmem, assumed_align=align),
                                cute.make_layout((n,)))

    @cute.jit
    def write_bias(self, sBias, stage, tKcK, rIdx, n_slots):
        # one thread per token row marks it valid (0) or masked (-inf)
        if tKcK[0, 0, 0][1] == 0:
            for m in cutlass.range_constexpr(cute.size(rIdx)):
                sBias[stage * self.tile_tokens + tKcK[0, m, 0][0]] = (
                    Float32(0.0) if self.live_slot(rIdx[m], n_slots) else -Float32.inf
                )


class Bf16Gather(GatherRows):
    """bf16 KV: each gathered row cp.async'd into the K stage, 16 bytes at a time. Config:
    d_qk."""

    @cute.jit
    def gather_bf16(self, mKV, sKs, sBias, stage, gmem_tiled_copy, gmem_thr_copy, tKcK, rIdx, n_slots):
        """cp.async one 16-byte chunk at a time from each gathered row; zero-fill masked rows."""
        tKsK = gmem_thr_copy.partition_D(sKs)
        self.write_bias(sBias, stage, tKcK, rIdx, n_slots)
        for m in cutlass.range_constexpr(cute.size(rIdx)):
            slot = rIdx[m]
            if self.live_slot(slot, n_slots):
                addr = self.row_address(mKV, slot, self.d_qk * 2)
                gRow_chunks = cute.tiled_divide(self.gmem_vec(addr, BFloat16, self.d_qk), (8,))
                for k in cutlass.range_constexpr(cute.size(tKsK, mode=[2])):
                    src = gRow_chunks[None, tKcK[0, 0, k][1] // 8]
                    cute.copy(
                        gmem_tiled_copy,
                        cute.make_tensor(src.iterator, tKsK[None, m, k].layout),
                        tKsK[None, m, k],
                    )
            else:
                for k in cutlass.range_constexpr(cute.size(tKsK, mode=[2])):
                    tKsK[None, m, k].fill(0.0)


class Fp8RegsPipeline(GatherRows):
    """fp8 records gathered into registers one tile ahead and dequantised into a K stage, row by
    row; the record format block (kv_format.py) holds the row's registers (make_fp8_regs), its
    loads (load_fp8_row) and its dequant (store_row, zero_row, k_tile_parts). Config:
    tile_tokens, rows_per_pass, mma_dtype."""

    @cute.jit
    def load_fp8_regs(self, mKV, tKcK, rIdx, n_slots, regs):
        """A whole tile of this thread's rows (load_fp8_row)."""
        q = self.col_slot(tKcK)
        for m in cutlass.range_constexpr(cute.size(rIdx)):
            self.load_fp8_row(mKV, q, rIdx[m], n_slots, regs, m)

    @cute.jit
    def dequant_fp8_regs(self, sKs, sBias, stage, copies, regs, src, has_next, ahead, defer_last=False):
        """Registers (make_fp8_regs) -> fp16 K stage (store_row: NoPE value * its scale, RoPE
        converted), masked rows zero; the rows' biases go to slice `stage` of sBias. copies = (tKcK,
        nope_thr_copy, gmem_thr_copy) from gather_copies. Each row is refilled (refill_row) as
        soon as it is stored, except the last one with defer_last (the caller refills it)."""
        tKcK, nope_thr_copy, gmem_thr_copy = copies
        rSlot = regs[-1]
        parts = self.k_tile_parts(sKs, nope_thr_copy, gmem_thr_copy)
        q = self.col_slot(tKcK)
        n_slots = self.tile_slots(src[-1], src[4], src[5], ahead - 2)
        for m in cutlass.range_constexpr(cute.size(rSlot)):
            r = tKcK[0, m, 0][0]
            live = self.live_slot(rSlot[m], n_slots)
            if live:
                self.store_row(regs, parts, m)
            else:
                self.zero_row(parts, m)
            if q == 0:
                sBias[stage * self.tile_tokens + r] = Float32(0.0) if live else -Float32.inf
            if const_expr(not (defer_last and m == cute.size(rSlot) - 1)):
                self.refill_row(copies, regs, src, has_next, ahead, m)

    @cute.jit
    def refill_row(self, copies, regs, src, has_next, ahead, m: cutlass.Constexpr):
        """Row m, once dequantised: its registers <- its record in the next tile (has_next, a
        runtime flag; the slot is in rIdx), then rIdx <- its slot in tile `ahead`. src = (mKV,
        rIdx, mIdx, row, tok_begin, tok_end, n_slots). Loading per row instead of after the tile
        gives each load up to a whole dequant more to land, and the slot of tile `ahead` is known
        before a producer that does not wait for EMPTY needs it."""
        mKV, rIdx, mIdx, row, tok_begin, tok_end, n_slots = src
        tKcK = copies[0]
        if has_next:
            self.load_fp8_row(mKV, self.col_slot(tKcK), rIdx[m], self.tile_slots(n_slots, tok_begin, tok_end, ahead - 1),
                              regs, m)
        rIdx[m] = self.index_at(mIdx, row, tok_begin, ahead, tok_end, tKcK[0, m, 0][0])


class Fp8RegsGather(Fp8DsMlaDequant, Fp8RegsPipeline):
    """fp8_ds_mla records through registers (Fp8RegsPipeline)."""


class Model1RegsGather(Model1Dequant, Fp8RegsPipeline):
    """model1_fp8 records through registers (Fp8RegsPipeline)."""


class ProducerPipeline(Fp8RegsPipeline):
    """A producer warpgroup gathers and dequantises each tile (Fp8RegsPipeline) into one of the
    K stages and hands it over by named barriers. Config: stages, bias_slots, mma_threads,
    num_threads."""

    @cute.jit
    def produce_tiles(self, mKV, mIdx, mLen, tokens_per_split, sK_layout, storage):
        """The producer warpgroup: tile t's records are dequantised into K stage t % STAGES as
        soon as the MMA warps release it (EMPTY), handed over (FULL); tile t+1's records travel
        global -> registers from the moment each row of tile t is stored."""
        tidx, _, _ = cute.arch.thread_idx()
        split, _, row = cute.arch.block_idx()
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sBias = storage.sBias.get_tensor(cute.make_layout(self.bias_slots * self.tile_tokens))
        tok_begin, tok_end, n_tiles = self.token_range(mIdx, mLen, row, split, tokens_per_split)
        _, gmem_thr_copy, nope_thr_copy, tKcK = self.gather_copies(tidx - self.mma_threads)
        rIdx = cute.make_rmem_tensor((self.tile_tokens // self.rows_per_pass,), Int32)
        regs = self.make_fp8_regs()
        copies = (tKcK, nope_thr_copy, gmem_thr_copy)
        n_slots = self.cache_slots(mKV)     # once per CTA: the producer's row path is issue-bound
        src = (mKV, rIdx, mIdx, row, tok_begin, tok_end, n_slots)
        self.load_indices(mIdx, row, tok_begin, 0, tok_end, tKcK, rIdx)
        if n_tiles > 0:
            self.load_fp8_regs(mKV, tKcK, rIdx, self.tile_slots(n_slots, tok_begin, tok_end, 0), regs)
        self.load_indices(mIdx, row, tok_begin, 1, tok_end, tKcK, rIdx)
        for t in cutlass.range(n_tiles, unroll=1):
            stage = t % self.stages
            if t >= self.stages:
                named_sync(BAR_EMPTY + stage, self.num_threads)
            # the last row's refill follows the hand-over, so the fence before FULL is not queued
            # behind its loads
            self.dequant_fp8_regs(sK[None, None, stage], sBias, stage, copies, regs, src, t + 1 < n_tiles, t + 2,
                                  defer_last=True)
            cute.arch.fence_view_async_shared()     # the dequantised stage is read by wgmma
            named_arrive(BAR_FULL + stage, self.num_threads)
            self.refill_row(copies, regs, src, t + 1 < n_tiles, t + 2, cute.size(rIdx) - 1)


class Fp8Producer(Fp8DsMlaDequant, ProducerPipeline):
    """fp8_ds_mla records by a producer warpgroup (ProducerPipeline)."""


class Model1Producer(Model1Dequant, ProducerPipeline):
    """model1_fp8 records by a producer warpgroup (ProducerPipeline)."""
