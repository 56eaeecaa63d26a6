"""The locality pass of extend's gather-bound form: each row's entries in cache order.

Extend at 8-32 heads over bf16 KV reads 1152 bytes a token for a few MMAs, so its time is the
gather's. A prefill chunk's rows index one sequence's cache; when each row's entries are in
ascending slot order, tile j of every row reads about the j-th band of that cache, and the CTAs
that run together read nearby bands, which come from HBM about once for all of them instead of
once per row (docs/notes/extend.md, "Rows in cache order").

One CTA orders one row, stably by bucket: the row's live range [lo, hi] (its smallest and largest
non-negative ids among the first `length` entries) cut into at most 128 buckets of 2^shift ids,
and -1 and every other negative id in a last bucket, where the attention kernel masks them as it
masks ids past the cache; the entries past `length` are written as -1. Bucket order is all the
locality needs (a 64-entry tile of a 2048-entry row spans 2-4 buckets, 1/32 of the range, as a
full sort's tile does), and a counting sort costs a few hundred instructions a thread where a
bitonic network over the row cost ~4000. Each warp takes a contiguous segment of the row; the
counts are [bucket, warp] in shared memory, their bucket-major exclusive sum gives each (bucket,
warp) its first place, and inside a warp ballots rank the lanes of a bucket in lane order, so
the order is a function of the values only and the pass is deterministic."""
import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op

from ..scan import block_exclusive_sum

ORDER_THREADS = 256
ORDER_WARPS = ORDER_THREADS // 32
BUCKETS = ORDER_THREADS   # counters a warp: thread t sums bucket t in the scan
BUCKET_BITS = 7           # the live range in at most 2^7 buckets, ids in it at 2^shift a bucket
INVALID = BUCKETS - 1     # negative ids, after every live bucket
NOT_LIVE = BUCKETS        # entries past `length` (take no part; a key no bucket has)
KEY_BITS = 9              # the bits of a key, NOT_LIVE included


@dsl_user_op
def st_global_cs_u32(addr, value, *, loc=None, ip=None):
    """A 32-bit store marked streaming (st.global.cs: evict first from L1 and L2)."""
    llvm.inline_asm(None, [Int64(addr).ir_value(loc=loc, ip=ip), Uint32(value).ir_value(loc=loc, ip=ip)],
                    "st.global.cs.u32 [$0], $1;", "l,r", has_side_effects=True, is_align_stack=False,
                    asm_dialect=llvm.AsmDialect.AD_ATT)


@cute.jit
def bucket_of(v: Int32, lo: Int32, shift: Uint32) -> Int32:
    b = Int32(INVALID)
    if v >= 0:
        b = Int32(Uint32(v - lo) >> shift)
    return b


class IndexOrder:
    """Config: width_cap (the widest row, Caps.topk). Arguments: indices [rows, width] i32,
    lengths [rows] i32, the ordered copy [rows, width] i32 (scratch), the row count ([1] i32)
    and whether to read it."""

    def __init__(self, width_cap: int):
        self.per_thread = max(1, -(-width_cap // ORDER_THREADS))   # entries a lane holds
        self.seg = 32 * self.per_thread                            # a warp's contiguous segment
        self.n = ORDER_WARPS * self.seg

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
        warp = tidx // 32
        lane = tidx % 32
        smem = cutlass.utils.SmemAllocator()
        sOut = smem.allocate_tensor(Int32, cute.make_layout(self.n), byte_alignment=16)
        sCount = smem.allocate_tensor(Int32, cute.make_layout(BUCKETS * ORDER_WARPS), byte_alignment=16)
        sWarp = smem.allocate_tensor(Int32, cute.make_layout(3 * ORDER_WARPS), byte_alignment=16)
        cute.arch.griddepcontrol_wait()
        # the attention kernel after this one waits for the whole grid before it reads the copy
        cute.arch.griddepcontrol_launch_dependents()
        width = mEntries.shape[1]
        live_rows = cute.size(mEntries.shape[0])
        if has_num_rows != 0:
            live_rows = mNumRows[0]
        if width > 0:
            # every load issued before any is used (row count, length and the segment at clamped,
            # in-row positions): one memory latency, not one after the other
            raw_length = mLen[row]
            first = warp * self.seg + lane
            vals = cute.make_rmem_tensor((self.per_thread,), Int32)
            for i in cutlass.range_constexpr(self.per_thread):
                vals[i] = mEntries[row, cutlass.min(first + 32 * i, width - 1)]
            if row < live_rows:
                self.order_row(mOut, vals, row, width, cutlass.min(cutlass.max(raw_length, 0), width), first,
                               warp, lane, sOut, sCount, sWarp)

    @cute.jit
    def order_row(self, mOut: cute.Tensor, vals, row: Int32, width: Int32, length: Int32, first: Int32,
                  warp: Int32, lane: Int32, sOut, sCount, sWarp):
        """One row's counting sort, its entries in `vals` (this lane's positions first + 32 i)."""
        tidx = warp * 32 + lane
        lo = Int32(0x7FFFFFFF)
        hi = Int32(-1)
        for i in cutlass.range_constexpr(self.per_thread):
            v = vals[i]
            if first + 32 * i >= length:
                v = Int32(-1)
            vals[i] = v
            if v >= 0:
                lo = cutlass.min(lo, v)
                hi = cutlass.max(hi, v)
        for i in cutlass.range_constexpr(BUCKETS * ORDER_WARPS // ORDER_THREADS):
            sCount[tidx + i * ORDER_THREADS] = Int32(0)
        lo = cute.arch.warp_redux_sync(lo, "min")
        hi = cute.arch.warp_redux_sync(hi, "max")
        if lane == 0:
            sWarp[warp] = lo
            sWarp[ORDER_WARPS + warp] = hi
        cute.arch.sync_threads()
        for w in cutlass.range_constexpr(ORDER_WARPS):
            lo = cutlass.min(lo, sWarp[w])
            hi = cutlass.max(hi, sWarp[ORDER_WARPS + w])
        span = Uint32(cutlass.max(hi - lo, 0))               # 0 when no id is live
        shift = Uint32(cutlass.max(Int32(32 - BUCKET_BITS) - Int32(cute.arch.clz(span)), 0))
        # counts per (bucket, warp); bucket-major, so a bucket's warps sit together
        for i in cutlass.range_constexpr(self.per_thread):
            if first + 32 * i < length:
                b = bucket_of(vals[i], lo, shift)
                cute.arch.atomic_add((sCount.iterator + b * ORDER_WARPS + warp).llvm_ptr, Int32(1))
        cute.arch.sync_threads()
        # thread t owns bucket t: its warps' counts become their first places
        mine = Int32(0)
        for w in cutlass.range_constexpr(ORDER_WARPS):
            mine = mine + sCount[tidx * ORDER_WARPS + w]
        sSums = cute.make_tensor(sWarp.iterator + 2 * ORDER_WARPS, cute.make_layout(ORDER_WARPS))
        place = block_exclusive_sum(mine, sSums, warp, lane, ORDER_WARPS, False)
        for w in cutlass.range_constexpr(ORDER_WARPS):
            c = sCount[tidx * ORDER_WARPS + w]
            sCount[tidx * ORDER_WARPS + w] = place
            place = place + c
        cute.arch.sync_threads()
        # each warp places its segment 32 entries at a time, in lane order inside a bucket: the
        # lanes of a bucket found by ballots on its bits, the group's lowest lane takes the
        # group's places from the (bucket, warp) counter (one lane an address, so the order of
        # the atomics is program order) and hands the first to the others. Nothing a round
        # computes feeds the next round's registers.
        below = (Uint32(1) << Uint32(lane)) - Uint32(1)
        for i in cutlass.range_constexpr(self.per_thread):
            live = first + 32 * i < length
            b = Int32(NOT_LIVE)
            if live:
                b = bucket_of(vals[i], lo, shift)
            peers = Uint32(0xFFFFFFFF)
            for k in cutlass.range_constexpr(KEY_BITS):
                bit = (Uint32(b) >> Uint32(k)) & Uint32(1)
                ones = Uint32(cute.arch.vote_ballot_sync(bit != Uint32(0)))
                peers = peers & ~(ones ^ (Uint32(0) - bit))       # the lanes whose bit k is ours
            before = peers & below
            lead = Int32(31) - Int32(cute.arch.clz(peers & (Uint32(0) - peers)))   # lowest lane
            at = Int32(0)
            if live and before == Uint32(0):
                at = cute.arch.atomic_add((sCount.iterator + b * ORDER_WARPS + warp).llvm_ptr,
                                          Int32(cute.arch.popc(peers)))
            at = cute.arch.shuffle_sync(at, lead)
            if live:
                sOut[at + Int32(cute.arch.popc(before))] = vals[i]
        cute.arch.sync_threads()
        # streaming stores: the copy is read once, by the attention kernel, and should not
        # displace the lines of the cache it gathers from
        out_row = mOut[row, None].iterator.toint()
        for i in cutlass.range_constexpr(self.n // ORDER_THREADS):
            p = tidx + i * ORDER_THREADS
            if p < width:
                slot = Int32(-1)
                if p < length:
                    slot = sOut[p]
                st_global_cs_u32(out_row + Int64(p) * 4, Uint32(slot))

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
