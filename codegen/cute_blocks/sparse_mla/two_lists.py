"""Two index lists over two caches in one softmax (DeepSeek-V4: the sliding-window and the
compressed cache): the gather mixin (TwoLists), its model1_fp8 rows, the gather classes of each
form over two lists, and the entry kernels that take the second cache, indices and lengths."""
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32, const_expr

from .gather import Model1Producer, Model1RegsGather
from .gather_raw import Model1RawGather
from .kernel import ExtendKernel, SplitKernel


class TwoLists:
    """A main and an extra index list over two caches of one format, in one softmax (DeepSeek-V4:
    the sliding-window and the compressed cache). The kernel's mKV, mIdx and mLen are then pairs
    (main, extra); a row's entries run main first, then extra, in 64-token tiles that never mix
    the lists: the main part is padded to whole tiles (main_len rounded up to 64, `mt64`), so a
    split's range, the tile of an entry and its list follow from its position alone, and a row
    costs the tiles of its live entries only. Positions count that padded sequence; tok_end is
    (end, main_len, mt64, extra_len). Config: tile_tokens, page_size, extra_page_size."""

    def row_width(self, mIdx):
        return mIdx[0].shape[1] + mIdx[1].shape[1]

    def cache_slots(self, mKV):
        """(main, extra) token slots of the two cache tensors passed (GatherRows.cache_slots)."""
        return (Uint32(cutlass.max(mKV[0].shape[0], 0)) * Uint32(self.page_size),
                Uint32(cutlass.max(mKV[1].shape[0], 0)) * Uint32(self.extra_page_size))

    @cute.jit
    def token_range(self, mIdx, mLen, row, split, tokens_per_split):
        """(first position, (end, main_len, mt64, extra_len), tiles) of this CTA's part of the row."""
        main_len = cutlass.min(cutlass.max(mLen[0][row], 0), mIdx[0].shape[1])
        extra_len = cutlass.min(cutlass.max(mLen[1][row], 0), mIdx[1].shape[1])
        mt64 = (main_len + (self.tile_tokens - 1)) // self.tile_tokens * self.tile_tokens
        tok_begin = split * tokens_per_split
        end = cutlass.min(tok_begin + tokens_per_split, mt64 + extra_len)
        n_tiles = (cutlass.max(end - tok_begin, 0) + (self.tile_tokens - 1)) // self.tile_tokens
        return tok_begin, (end, main_len, mt64, extra_len), n_tiles

    @cute.jit
    def index_at(self, mIdx, row, tok_begin, tile, tok_end, tok) -> Int32:
        """Index of token `tok` of `tile` in its list as the caller wrote it; -1 past the split
        end or the list's length. It only becomes an address or a bias behind live_slot."""
        end, main_len, mt64, extra_len = tok_end
        pos = tok_begin + tile * self.tile_tokens + tok
        slot = Int32(-1)
        if pos < end:
            if pos < mt64:
                if pos < main_len:
                    slot = mIdx[0][row, pos]
            else:
                if pos - mt64 < extra_len:
                    slot = mIdx[1][row, pos - mt64]
        return slot

    @cute.jit
    def tile_slots(self, n_slots, tok_begin, tok_end, tile):
        """(main bound, extra bound, whether `tile` is in the extra list)."""
        return n_slots[0], n_slots[1], tok_begin + tile * self.tile_tokens >= tok_end[2]

    @cute.jit
    def live_slot(self, slot: Int32, n_slots):
        """GatherRows.live_slot against the bound of the slot's list (tile_slots)."""
        bound = n_slots[0]
        if n_slots[2]:
            bound = n_slots[1]
        return Uint32(slot) < bound


class Model1TwoLists(TwoLists):
    """model1_fp8 rows of a main and an extra cache (TwoLists): each row loaded from its list's."""

    @cute.jit
    def model1_rows(self, mKV, slot, n_slots):
        """Model1Dequant.model1_rows in the cache of the slot's list (n_slots: tile_slots)."""
        tok, scales = Int64(0), Int64(0)
        if self.live_slot(slot, n_slots):
            if n_slots[2]:
                tok = self.row_address(mKV[1], slot, self.record.token_bytes, self.extra_page_size)
                scales = self.scale_address(tok, slot, self.extra_page_size)
            else:
                tok = self.row_address(mKV[0], slot, self.record.token_bytes)
                scales = self.scale_address(tok, slot, self.page_size)
        return tok, scales


class Model1TwoListsGather(Model1TwoLists, Model1RegsGather):
    """model1_fp8 records of a main and an extra cache through registers."""


class Model1TwoListsProducer(Model1TwoLists, Model1Producer):
    """model1_fp8 records of a main and an extra cache by a producer warpgroup."""


class Model1TwoListsRaw(Model1TwoLists, Model1RawGather):
    """model1_fp8 records of a main and an extra cache staged raw in shared memory."""


class TwoListsSplitKernel(SplitKernel):
    """Decode over a main and an extra list in one softmax (TwoLists): the extra cache,
    indices and lengths follow the main ones; attend sees each as a (main, extra) pair."""

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,          # [rows, H, d_qk] bf16
        mKV: cute.Tensor,         # main cache: [blocks, page_bytes] u8 pages
        mIdx: cute.Tensor,        # [rows, width] i32
        mLen: cute.Tensor,        # [rows] i32
        mKVx: cute.Tensor,        # extra cache: [blocks_x, extra page_bytes] u8 pages
        mIdxX: cute.Tensor,       # [rows, width_x] i32
        mLenX: cute.Tensor,       # [rows] i32
        mPartO: cute.Tensor,      # [rows, splits, H, d_v] f16
        mPartLse: cute.Tensor,    # [rows, splits, H] f32
        sm_scale_log2: Float32,
        tokens_per_split: Int32,  # positions of the main-then-extra sequence per split
        stream,
    ):
        sQ_layout, sK_layout, sP_layout, SharedStorage, tiled_mma_s, tiled_mma = self.smem_and_mmas()
        grid = (cute.size(mPartO.shape[1]), self.head_blocks, cute.size(mQ.shape[0]))
        self.kernel(
            mQ, mKV, mIdx, mLen, mKVx, mIdxX, mLenX, mPartO, mPartLse, sm_scale_log2, tokens_per_split,
            sQ_layout, sK_layout, sP_layout, tiled_mma_s, tiled_mma, SharedStorage,
        ).launch(grid=grid, block=[self.num_threads, 1, 1], stream=stream, use_pdl=True, **self.launch_bound())

    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mKV: cute.Tensor, mIdx: cute.Tensor, mLen: cute.Tensor, mKVx: cute.Tensor,
               mIdxX: cute.Tensor, mLenX: cute.Tensor, mPartO: cute.Tensor, mPartLse: cute.Tensor,
               sm_scale_log2: Float32, tokens_per_split: Int32, sQ_layout: cute.ComposedLayout,
               sK_layout: cute.ComposedLayout, sP_layout: cute.ComposedLayout, tiled_mma_s: cute.TiledMma,
               tiled_mma: cute.TiledMma, SharedStorage: cutlass.Constexpr):
        # programmatic launch as in SplitKernel.kernel
        cute.arch.griddepcontrol_wait()
        cute.arch.griddepcontrol_launch_dependents()
        lists = ((mKV, mKVx), (mIdx, mIdxX), (mLen, mLenX))
        if const_expr(self.s_one_warpgroup or self.producer):
            self.split_roles(*lists, tokens_per_split, sK_layout, SharedStorage, (
                mQ, *lists, (mPartO, mPartLse, tokens_per_split), sm_scale_log2,
                sQ_layout, sK_layout, sP_layout, tiled_mma_s, tiled_mma,
            ))
        else:
            self.attend(
                mQ, *lists, (mPartO, mPartLse, tokens_per_split), sm_scale_log2,
                sQ_layout, sK_layout, sP_layout, tiled_mma_s, tiled_mma, SharedStorage,
            )


class TwoListsExtendKernel(ExtendKernel):
    """Extend over a main and an extra list in one softmax (TwoLists), as
    TwoListsSplitKernel is to SplitKernel."""

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,          # [rows, H, d_qk] bf16
        mKV: cute.Tensor,         # main cache pages
        mIdx: cute.Tensor,        # [rows, width] i32
        mLen: cute.Tensor,        # [rows] i32
        mKVx: cute.Tensor,        # extra cache pages
        mIdxX: cute.Tensor,       # [rows, width_x] i32
        mLenX: cute.Tensor,       # [rows] i32
        mO: cute.Tensor,          # [rows, H, d_v] bf16
        mLse: cute.Tensor,        # [rows, H] f32
        mSink: cute.Tensor,       # [H] f32, read only when has_sink != 0
        mNumRows: cute.Tensor,    # [1] i32: rows in use
        sm_scale_log2: Float32,
        has_sink: Int32,
        lse_natural: Int32,
        has_num_rows: Int32,
        stream,
    ):
        sQ_layout, sK_layout, sP_layout, SharedStorage, tiled_mma_s, tiled_mma = self.smem_and_mmas()
        grid = (1, self.head_blocks, cute.size(mQ.shape[0]))
        self.kernel(
            mQ, mKV, mIdx, mLen, mKVx, mIdxX, mLenX, mO, mLse, mSink, mNumRows, sm_scale_log2, has_sink,
            lse_natural, has_num_rows, sQ_layout, sK_layout, sP_layout, tiled_mma_s, tiled_mma, SharedStorage,
        ).launch(grid=grid, block=[self.num_threads, 1, 1], stream=stream, use_pdl=True, **self.launch_bound())

    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mKV: cute.Tensor, mIdx: cute.Tensor, mLen: cute.Tensor, mKVx: cute.Tensor,
               mIdxX: cute.Tensor, mLenX: cute.Tensor, mO: cute.Tensor, mLse: cute.Tensor, mSink: cute.Tensor,
               mNumRows: cute.Tensor, sm_scale_log2: Float32, has_sink: Int32, lse_natural: Int32,
               has_num_rows: Int32, sQ_layout: cute.ComposedLayout, sK_layout: cute.ComposedLayout,
               sP_layout: cute.ComposedLayout, tiled_mma_s: cute.TiledMma, tiled_mma: cute.TiledMma,
               SharedStorage: cutlass.Constexpr):
        # programmatic launch and the capacity grid as in ExtendKernel.kernel
        cute.arch.griddepcontrol_wait()
        _, _, row = cute.arch.block_idx()
        live_rows = cute.size(mQ.shape[0])
        if has_num_rows != 0:
            live_rows = mNumRows[0]
        if row < live_rows:
            lists = ((mKV, mKVx), (mIdx, mIdxX), (mLen, mLenX))
            if const_expr(self.s_one_warpgroup or self.producer):
                self.split_roles(*lists, self.row_width(lists[1]), sK_layout, SharedStorage, (
                    mQ, *lists, (mO, mLse, mSink, has_sink, lse_natural), sm_scale_log2,
                    sQ_layout, sK_layout, sP_layout, tiled_mma_s, tiled_mma,
                ))
            else:
                self.attend(
                    mQ, *lists, (mO, mLse, mSink, has_sink, lse_natural), sm_scale_log2,
                    sQ_layout, sK_layout, sP_layout, tiled_mma_s, tiled_mma, SharedStorage,
                )
