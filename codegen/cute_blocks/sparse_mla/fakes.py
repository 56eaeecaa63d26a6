"""Fake arguments for compiling the sparse MLA kernels (cute.compile), symbolic in rows, width,
cache blocks and splits; the head dims and the KV record come from the spec."""
import cutlass.cute as cute
from cutlass import BFloat16, Float16, Float32, Int32, Uint8

from .kv_format import PAGE_SIZE
from .kv_layout import kv_record


def fake_partials(num_heads: int, d_v: int, rows, splits):
    """[rows, splits, H, d_v] fp16 partial o and [rows, splits, H] fp32 partial lse."""
    part_o = cute.runtime.make_fake_compact_tensor(
        Float16, (rows, splits, num_heads, d_v), stride_order=(3, 2, 1, 0), assumed_align=16
    )
    part_lse = cute.runtime.make_fake_compact_tensor(
        Float32, (rows, splits, num_heads), stride_order=(2, 1, 0), assumed_align=4
    )
    return part_o, part_lse


def fake_outputs(num_heads: int, d_v: int, rows):
    """[rows, H, d_v] bf16 out, [rows, H] fp32 lse and the [H] fp32 sink."""
    out = cute.runtime.make_fake_compact_tensor(
        BFloat16, (rows, num_heads, d_v), stride_order=(2, 1, 0), assumed_align=16
    )
    lse = cute.runtime.make_fake_compact_tensor(Float32, (rows, num_heads), stride_order=(1, 0), assumed_align=4)
    sink = cute.runtime.make_fake_compact_tensor(Float32, (num_heads,), assumed_align=4)
    return out, lse, sink


def fake_kv(kv_format: str, d_nope: int, d_rope: int, blocks, page_size: int = PAGE_SIZE):
    """A page-strided cache of the format's record (kv_layout): [blocks, 64, record] u8 for
    fp8_ds_mla (656 bytes), bf16 for bf16 (d_nope + d_rope dims); [blocks, page_bytes] u8 pages of
    page_size tokens for model1_fp8."""
    rec = kv_record(kv_format, d_nope, d_rope)
    if kv_format == "model1_fp8":
        return cute.runtime.make_fake_tensor(
            Uint8, (blocks, rec.page_bytes(page_size)), (cute.sym_int64(divisibility=16), 1), assumed_align=16,
        )
    if rec.dtype == "uint8":
        return cute.runtime.make_fake_tensor(
            Uint8, (blocks, PAGE_SIZE, rec.last_dim), (cute.sym_int64(divisibility=16), rec.last_dim, 1),
            assumed_align=16,
        )
    return cute.runtime.make_fake_tensor(
        BFloat16, (blocks, PAGE_SIZE, rec.last_dim), (cute.sym_int64(divisibility=8), rec.last_dim, 1),
        assumed_align=16,
    )


def split_fakes(num_heads: int, kv_format: str, extend: bool, tile_tokens: int, d_nope: int, d_rope: int, d_v: int,
                page_size: int = PAGE_SIZE, extra_page_size: int = 0):
    """The attention kernel's arguments: q, kv, indices, lengths, then extend's out, lse, sink,
    row count and scalars, or decode's partials and scalars; then the stream."""
    rows = cute.sym_int32()
    width = cute.sym_int32()
    blocks = cute.sym_int32()
    q = cute.runtime.make_fake_compact_tensor(
        BFloat16, (rows, num_heads, d_nope + d_rope), stride_order=(2, 1, 0), assumed_align=16
    )
    kv = fake_kv(kv_format, d_nope, d_rope, blocks, page_size)
    indices = cute.runtime.make_fake_compact_tensor(
        Int32, (rows, width), stride_order=(1, 0), assumed_align=16
    )
    lengths = cute.runtime.make_fake_compact_tensor(Int32, (rows,), assumed_align=4)
    lists = (q, kv, indices, lengths)
    if extra_page_size:   # the extra cache, its indices and lengths follow the main ones
        lists += (fake_kv(kv_format, d_nope, d_rope, cute.sym_int32(), extra_page_size),
                  cute.runtime.make_fake_compact_tensor(Int32, (rows, cute.sym_int32()), stride_order=(1, 0),
                                                        assumed_align=16),
                  cute.runtime.make_fake_compact_tensor(Int32, (rows,), assumed_align=4))
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    if extend:
        out, lse, sink = fake_outputs(num_heads, d_v, rows)
        num_rows = cute.runtime.make_fake_compact_tensor(Int32, (1,), assumed_align=4)
        return (*lists, out, lse, sink, num_rows, Float32(1.0), Int32(0), Int32(0), Int32(1), stream)
    part_o, part_lse = fake_partials(num_heads, d_v, rows, cute.sym_int32())
    return (*lists, part_o, part_lse, Float32(1.0), Int32(tile_tokens), stream)


def combine_fakes(num_heads: int, d_v: int):
    """The combine kernel's arguments: partials, out, lse, sink, has_sink, lse_natural, stream."""
    rows = cute.sym_int32()
    part_o, part_lse = fake_partials(num_heads, d_v, rows, cute.sym_int32())
    out, lse, sink = fake_outputs(num_heads, d_v, rows)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return (part_o, part_lse, out, lse, sink, Int32(0), Int32(0), stream)
