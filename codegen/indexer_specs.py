"""Specs of the lightning indexer: fp8 logits, top-k selection, and the fused small-batch path.

Registered with codegen.specs (imported at the end of that module), so KernelSpec.from_json,
the artifact cache and the build workers know these families."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .specs import KernelSpec, _require, register_family
from .toolchain import SUPPORTED_ARCHS

INDEXER_HEADS = (8, 16, 32, 64)
COMPRESS_RATIOS = (1, 4, 128)
LOGITS_MODES = ("paged", "contiguous")
TOPK_MAX = 2048
TOPK_WIDTH_MAX = 262144

# Largest dynamic shared memory one CTA may use (bytes); the top-k chunk is sized from it.
_SMEM_LIMIT = {"sm_90a": 232448, "sm_120a": 101376}


def topk_tiling(arch: str) -> dict:
    """Top-k tile parameters (pure Python, shared by the templates and the planner).

    chunk:     widest row selected by one CTA from shared memory (u32 keys): chunk_final.
    row_chunk, row_threads, row_min_rows: sm_90a also selects rows up to row_chunk logits in one
               CTA (128 KB of keys, one 1024-thread CTA per SM: row_final) when there are at least
               row_min_rows of them; fewer such rows leave SMs idle and take the wide top-k instead.
    merge_cap: candidates one merge CTA holds (u32 key + i32 position each), fused path.
    threads:   CTA size of chunk_final and the merge kernels.
    bins:      radix digit histogram (11-bit digits: 3 passes cover 32-bit keys).
    wide_*:    rows wider than `chunk`: logits per tile, CTA size, resident CTAs per SM and
               histogram bits of the threshold kernel; tie_cap keys of the threshold bin fit one
               CTA's shared memory. wide_hit_tiles: tiles per CTA whose hit masks are kept;
               wide_long_hit_tiles (sm_90a): those of wide_chunk_long, the variant for CTAs with more
               tiles than that (prefill batches: 32 tiles a CTA at 256 rows x 262144), 8 KB more
               shared memory a CTA. sm_120a's 100 KB an SM hold three CTAs.
    group, group_cap (sm_90a): the grouped top-k of wide rows (Caps.group_select): logits per
               group, and the logits one row_threads CTA selects among (K x group, keys and
               positions in shared memory)."""
    chunk = 16384 if arch == "sm_90a" else 8192
    return {"chunk": chunk, "merge_cap": chunk, "threads": 512, "bins": 2048,
            "row_chunk": 32768 if arch == "sm_90a" else 0, "row_threads": 1024, "row_min_rows": 64,
            "fused_chunk": 8192, "fused_warps": 16,
            "wide_tile": 4096, "wide_threads": 256, "wide_bits": 12,
            "wide_min_ctas": 4 if arch == "sm_90a" else 3, "wide_hit_tiles": 16,
            "wide_long_hit_tiles": 32 if arch == "sm_90a" else 0,
            "tie_cap": chunk, "group": 8, "group_cap": 16384 if arch == "sm_90a" else 0}


def logits_ctas_per_sm(num_heads: int, arch: str) -> int:
    """Resident logits CTAs per SM the kernel is compiled for and the planner sizes its persistent
    grid by. sm_90a: 4 CTAs x (q tiles + cp.async stages of a page), both wgmma operands in shared
    memory: ~94 registers, 128 with row pairs (their 64 accumulators). Elsewhere q's mma.sync
    fragments stay in registers (register-bound)."""
    if arch == "sm_90a":
        return 4
    return {8: 6, 16: 4, 32: 3, 64: 3}[num_heads]


def logits_stages(rows_per_unit: int) -> int:
    """cp.async page stages of the sm_90a logits kernel: 4 CTAs x (q tiles + stages) fit in 227 KB."""
    return 5 if rows_per_unit == 1 else 4


def _check_index_fields(c: str, spec) -> None:
    """Fields every indexer spec shares: head dim, index heads, compress ratio."""
    _require(c, "index_head_dim", spec.index_head_dim, spec.index_head_dim == 128, "128")
    _require(c, "num_heads", spec.num_heads, spec.num_heads in INDEXER_HEADS, ", ".join(map(str, INDEXER_HEADS)))
    _require(c, "compress_ratio", spec.compress_ratio, spec.compress_ratio in COMPRESS_RATIOS,
             ", ".join(map(str, COMPRESS_RATIOS)))


def _check_topk_fields(c: str, spec) -> None:
    """Fields every top-k spec shares: K bound, width bound, scores flag."""
    _require(c, "k", spec.k, isinstance(spec.k, int) and 128 <= spec.k <= TOPK_MAX and spec.k % 128 == 0,
             f"a multiple of 128 in [128, {TOPK_MAX}]")
    _require(c, "max_width", spec.max_width, isinstance(spec.max_width, int) and 1 <= spec.max_width <= TOPK_WIDTH_MAX,
             f"an int in [1, {TOPK_WIDTH_MAX}]")
    _require(c, "with_scores", spec.with_scores, isinstance(spec.with_scores, bool), "True, False")


def _check_arch(c: str, arch: str) -> None:
    _require(c, "arch", arch, arch in SUPPORTED_ARCHS, ", ".join(SUPPORTED_ARCHS))


@register_family
@dataclass(frozen=True)
class IndexerLogitsSpec(KernelSpec):
    """logits[r, t] = k_scale[t] * sum_h weights[r, h] * relu(q[r, h] . k[t]) over an fp8 K cache.

    mode "paged":      K through a block table over [blocks, 64, 132] pages (decode, MTP rows);
                       row r holds floor(lengths[r] / compress_ratio) entries.
    mode "contiguous": gathered K [n, 128] e4m3 + scales [n] fp32 with per-row [start, end)
                       bounds in entries (prefill); compress_ratio must be 1 (bounds are entries)."""

    family: ClassVar[str] = "indexer_logits"
    template: ClassVar[str] = "indexer_logits.py.j2"

    index_head_dim: int = 128
    num_heads: int = 64
    compress_ratio: int = 1
    mode: str = "paged"
    page_size: int = 64
    rows_per_unit: int = 1           # query rows scored per staged K page (paged: of one request, MTP)
    arch: str = "sm_90a"

    def __post_init__(self) -> None:
        c = type(self).__name__
        _check_index_fields(c, self)
        _require(c, "mode", self.mode, self.mode in LOGITS_MODES, ", ".join(LOGITS_MODES))
        _require(c, "rows_per_unit", self.rows_per_unit,
                 self.rows_per_unit == 1 or (self.rows_per_unit == 2 and self.arch == "sm_90a"),
                 "1, or 2 on sm_90a")
        _require(c, "compress_ratio", self.compress_ratio, self.mode == "paged" or self.compress_ratio == 1,
                 "1 with mode 'contiguous' (its bounds are already in entries)")
        _require(c, "page_size", self.page_size, self.page_size == 64, "64")
        _check_arch(c, self.arch)

    @property
    def name(self) -> str:
        group = f"_g{self.rows_per_unit}" if self.rows_per_unit > 1 else ""
        return f"indexer_logits_{self.mode}_h{self.num_heads}_c{self.compress_ratio}{group}_{self.arch}"

    def template_context(self) -> dict:
        return {"num_heads": self.num_heads, "head_dim": self.index_head_dim, "compress_ratio": self.compress_ratio,
                "mode": self.mode, "page_size": self.page_size, "arch": self.arch,
                "warps": 4, "min_ctas": logits_ctas_per_sm(self.num_heads, self.arch),
                "rows_per_unit": self.rows_per_unit, "nbuf": logits_stages(self.rows_per_unit)}


@register_family
@dataclass(frozen=True)
class TopKSpec(KernelSpec):
    """Exact per-row top-k of fp32 logits: int32 row-relative positions with a -1 tail, or physical
    slots through a block table; optionally the fp32 scores (-inf where invalid).

    `k` is the largest K served: any multiple of 128 up to it runs on the same artifact.
    `max_width` bounds the row width (it sizes the per-CTA tile table of the wide-row kernel)."""

    family: ClassVar[str] = "topk"
    template: ClassVar[str] = "topk.py.j2"

    k: int = 2048
    max_width: int = TOPK_WIDTH_MAX
    with_scores: bool = False
    arch: str = "sm_90a"

    def __post_init__(self) -> None:
        c = type(self).__name__
        _check_topk_fields(c, self)
        _check_arch(c, self.arch)

    @property
    def name(self) -> str:
        return f"topk_k{self.k}_w{self.max_width}{'_scores' if self.with_scores else ''}_{self.arch}"

    def template_context(self) -> dict:
        return {"k_max": self.k, "max_width": self.max_width, "with_scores": self.with_scores, "arch": self.arch,
                "tile": topk_tiling(self.arch)}


@register_family
@dataclass(frozen=True)
class IndexerTopKSpec(KernelSpec):
    """Fused paged indexer + top-k for small batches: each CTA scores a chunk of tokens into shared
    memory and selects its top-k there, so the [rows, width] logits never reach HBM; merge kernels
    (the same as TopKSpec's) reduce the chunk candidates to the row's top-k."""

    family: ClassVar[str] = "indexer_topk"
    template: ClassVar[str] = "indexer_topk_fused.py.j2"

    index_head_dim: int = 128
    num_heads: int = 64
    compress_ratio: int = 1
    k: int = 2048
    max_width: int = TOPK_WIDTH_MAX
    with_scores: bool = False
    page_size: int = 64
    arch: str = "sm_90a"

    def __post_init__(self) -> None:
        c = type(self).__name__
        _check_index_fields(c, self)
        _check_topk_fields(c, self)
        _require(c, "page_size", self.page_size, self.page_size == 64, "64")
        _check_arch(c, self.arch)

    @property
    def name(self) -> str:
        return (f"indexer_topk_h{self.num_heads}_c{self.compress_ratio}_k{self.k}_w{self.max_width}"
                f"{'_scores' if self.with_scores else ''}_{self.arch}")

    def template_context(self) -> dict:
        return {"num_heads": self.num_heads, "head_dim": self.index_head_dim, "compress_ratio": self.compress_ratio,
                "k_max": self.k, "max_width": self.max_width, "with_scores": self.with_scores,
                "page_size": self.page_size, "arch": self.arch,
                # mma.sync: q and the accumulators need ~170 registers at 32+ heads, so 8 warps keep
                # them unspilled; sm_90a keeps q in shared memory (wgmma), so 16 warps (4 pages per step)
                "tile": {**topk_tiling(self.arch),
                         "fused_warps": 16 if self.arch == "sm_90a" or self.num_heads < 32 else 8}}
