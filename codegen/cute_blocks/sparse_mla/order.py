"""The locality pass of extend's gather-bound form: each row's entries in cache order.

Extend at 8-32 heads over bf16 KV reads 1152 bytes a token for a few MMAs, so its time is the
gather's. A prefill chunk's rows index one sequence's cache; when each row's entries are in
ascending slot order, tile j of every row reads about the j-th band of that cache, and the CTAs
that run together read nearby bands, which come from HBM about once for all of them instead of
once per row (docs/notes/extend.md, "Rows in cache order").

One CTA sorts one row: the first `length` entries, as unsigned words, so -1 and every other
negative id sort last, past the live slots, where the attention kernel masks them as it masks
ids past the cache; the entries past `length` are written as -1. A bitonic network over the row
padded to a power of two (padding: 0xFFFFFFFF, sorted past the row's entries) in shared memory.
The order is a function of the values only, so the pass is deterministic."""
import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op

ORDER_THREADS = 256


@dsl_user_op
def st_global_cs_u32(addr, value, *, loc=None, ip=None):
    """A 32-bit store marked streaming (st.global.cs: evict first from L1 and L2)."""
    llvm.inline_asm(None, [Int64(addr).ir_value(loc=loc, ip=ip), Uint32(value).ir_value(loc=loc, ip=ip)],
                    "st.global.cs.u32 [$0], $1;", "l,r", has_side_effects=True, is_align_stack=False,
                    asm_dialect=llvm.AsmDialect.AD_ATT)


def _stages(n: int) -> tuple:
    """(k, j) of each compare-exchange stage of a bitonic sort of n (a power of two) values."""
    out = []
    k = 2
    while k <= n:
        j = k // 2
        while j >= 1:
            out.append((k, j))
            j //= 2
        k *= 2
    return tuple(out)


class IndexOrder:
    """Config: width_cap (the widest row, Caps.topk). Arguments: indices [rows, width] i32,
    lengths [rows] i32, the ordered copy [rows, width] i32 (scratch), the row count ([1] i32)
    and whether to read it."""

    def __init__(self, width_cap: int):
        self.n = max(2 * ORDER_THREADS, 1 << (width_cap - 1).bit_length())
        self.stages = _stages(self.n)

    @cute.jit
    def __call__(self, mEntries: cute.Tensor, mLen: cute.Tensor, mOut: cute.Tensor, mNumRows: cute.Tensor,
                 has_num_rows: Int32, stream):
        self.kernel(mEntries, mLen, mOut, mNumRows, has_num_rows).launch(
            grid=(cute.size(mEntries.shape[0]), 1, 1), block=[ORDER_THREADS, 1, 1], stream=stream, use_pdl=True)

    @cute.kernel
    def kernel(self, mEntries: cute.Tensor, mLen: cute.Tensor, mOut: cute.Tensor, mNumRows: cute.Tensor,
               has_num_rows: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        smem = cutlass.utils.SmemAllocator()
        sV = smem.allocate_tensor(Uint32, cute.make_layout(self.n), byte_alignment=16)
        cute.arch.griddepcontrol_wait()
        # the attention kernel after this one waits for the whole grid before it reads the copy
        cute.arch.griddepcontrol_launch_dependents()
        live_rows = cute.size(mEntries.shape[0])
        if has_num_rows != 0:
            live_rows = mNumRows[0]
        if row < live_rows:
            width = mEntries.shape[1]
            length = cutlass.min(cutlass.max(mLen[row], 0), width)
            for i in cutlass.range_constexpr(self.n // ORDER_THREADS):
                p = tidx + i * ORDER_THREADS
                v = Uint32(0xFFFFFFFF)
                if p < length:
                    v = Uint32(mEntries[row, p])
                sV[p] = v
            cute.arch.sync_threads()
            for s in cutlass.range_constexpr(len(self.stages)):
                k, j = self.stages[s]
                for i in cutlass.range_constexpr(self.n // 2 // ORDER_THREADS):
                    pair = tidx + i * ORDER_THREADS
                    a = (pair // j) * (2 * j) + pair % j        # j a power of two: shifts and masks
                    b = a + j
                    va = sV[a]
                    vb = sV[b]
                    lo = cutlass.min(va, vb)
                    hi = cutlass.max(va, vb)
                    first = lo                    # ascending runs where (a & k) == 0
                    second = hi
                    if (a & k) != 0:
                        first = hi
                        second = lo
                    sV[a] = first
                    sV[b] = second
                cute.arch.sync_threads()
            # streaming stores: the copy is read once, by the attention kernel, and should not
            # displace the lines of the cache it gathers from
            out_row = mOut[row, None].iterator.toint()
            for i in cutlass.range_constexpr(self.n // ORDER_THREADS):
                p = tidx + i * ORDER_THREADS
                if p < width:
                    slot = Uint32(0xFFFFFFFF)
                    if p < length:
                        slot = sV[p]
                    st_global_cs_u32(out_row + Int64(p) * 4, slot)


def order_fakes():
    """The locality pass's arguments: indices, lengths, the ordered copy, the row count, the flag."""
    rows = cute.sym_int32()
    width = cute.sym_int32()
    idx = cute.runtime.make_fake_compact_tensor(Int32, (rows, width), stride_order=(1, 0), assumed_align=16)
    out = cute.runtime.make_fake_compact_tensor(Int32, (rows, width), stride_order=(1, 0), assumed_align=16)
    lengths = cute.runtime.make_fake_compact_tensor(Int32, (rows,), assumed_align=4)
    num_rows = cute.runtime.make_fake_compact_tensor(Int32, (1,), assumed_align=4)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return (idx, lengths, out, num_rows, Int32(0), stream)
