"""Kernel specs: frozen dataclasses whose canonical JSON is the kernel's identity.

Validation happens at construction and names the offending field and the allowed values, so a
bad spec never reaches a template."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, ClassVar

from .toolchain import SUPPORTED_ARCHS


class SpecError(ValueError):
    """A spec field holds a value the generator does not support."""

    def __init__(self, spec_cls: str, field: str, value: Any, allowed: str):
        self.field = field
        super().__init__(f"{spec_cls}.{field}: got {value!r}; allowed: {allowed}")


def _require(cls: str, field: str, value: Any, ok: bool, allowed: str) -> None:
    if not ok:
        raise SpecError(cls, field, value, allowed)


@dataclass(frozen=True)
class KernelSpec:
    """Common base: a family name, a template, an arch; canonical JSON and a readable name."""

    family: ClassVar[str] = ""
    template: ClassVar[str] = ""

    def canonical_json(self) -> str:
        body = {"family": self.family, **dataclasses.asdict(self)}
        return json.dumps(body, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "KernelSpec":
        body = json.loads(text)
        family = body.pop("family")
        spec_cls = SPEC_FAMILIES.get(family)
        if spec_cls is None:
            raise SpecError("KernelSpec", "family", family, ", ".join(sorted(SPEC_FAMILIES)))
        return spec_cls(**body)

    @property
    def name(self) -> str:  # pragma: no cover - overridden
        raise NotImplementedError

    def template_context(self) -> dict:  # pragma: no cover - overridden
        raise NotImplementedError


SPEC_FAMILIES: dict[str, type[KernelSpec]] = {}


def register_family(cls: type[KernelSpec]) -> type[KernelSpec]:
    """Class decorator: make a spec family known to KernelSpec.from_json."""
    SPEC_FAMILIES[cls.family] = cls
    return cls


SPARSE_MLA_HEADS = (8, 16, 32, 64, 128)
# The head-dim sets each KV format serves, as (q_head_dim, kv_lora_rank, rope_dim, v_head_dim):
# q and K are kv_lora_rank NoPE dims then rope_dim RoPE dims, V the first v_head_dim dims of K.
# A format's record layout follows from them (codegen/cute_blocks/sparse_mla/kv_layout.py).
SPARSE_MLA_HEAD_DIMS: dict[str, tuple[tuple[int, int, int, int], ...]] = {
    "fp8_ds_mla": ((576, 512, 64, 512),),     # DeepSeek-V3.2, GLM-5
    "bf16": ((576, 512, 64, 512), (512, 448, 64, 512)),   # DeepSeek-V4's dims too (what engines dequantise to)
    "model1_fp8": ((512, 448, 64, 512),),     # DeepSeek-V4: V is all 512 dims of K
}
# Tokens per cache page each KV format serves (model1_fp8: the sliding-window cache's pages).
SPARSE_MLA_PAGE_SIZES = {"fp8_ds_mla": (64,), "bf16": (64,), "model1_fp8": (64, 256)}
# Pages of the extra (compressed) cache a format serves: C4 layers 64 entries, C128 layers 2.
SPARSE_MLA_EXTRA_PAGE_SIZES = {"model1_fp8": (64, 2)}
# (kv_format, arch) -> head counts served where a format does not serve every head count (none now).
SPARSE_MLA_FORMAT_HEADS: dict[tuple[str, str], tuple[int, ...]] = {}
KV_FORMATS = tuple(SPARSE_MLA_HEAD_DIMS)
_HEAD_DIM_FIELDS = ("q_head_dim", "kv_lora_rank", "rope_dim", "v_head_dim")
SPARSE_MLA_MODES = ("decode", "extend")
MAX_TOPK = 8192   # the widest index row a sparse MLA spec may serve (DeepSeek-V4 C128 at 1M context)


@register_family
@dataclass(frozen=True)
class SparseMLASpec(KernelSpec):
    """Sparse MLA attention over a paged latent KV cache (DeepSeek V3.2 / GLM-5 shapes).

    `topk` is the widest index row the kernel serves; any narrower width that is a multiple of
    64 runs on the same artifact."""

    family: ClassVar[str] = "sparse_mla"
    template: ClassVar[str] = "sparse_mla.py.j2"

    q_head_dim: int = 576
    kv_lora_rank: int = 512
    rope_dim: int = 64
    v_head_dim: int = 512
    num_heads: int = 128
    topk: int = 2048
    kv_format: str = "fp8_ds_mla"
    page_size: int = 64
    mode: str = "decode"
    arch: str = "sm_90a"
    # DeepSeek-V4: an extra (compressed) index list over a second cache, in the same softmax as
    # the main one; 0: none. extra_topk is its widest row, extra_page_size its cache's page.
    extra_topk: int = 0
    extra_page_size: int = 0

    def __post_init__(self) -> None:
        c = type(self).__name__
        _require(c, "kv_format", self.kv_format, self.kv_format in KV_FORMATS, ", ".join(KV_FORMATS))
        self._check_head_dims(c)
        _require(c, "num_heads", self.num_heads, self.num_heads in SPARSE_MLA_HEADS,
                 ", ".join(map(str, SPARSE_MLA_HEADS)))
        _require(c, "topk", self.topk, isinstance(self.topk, int) and 64 <= self.topk <= MAX_TOPK and self.topk % 64 == 0,
                 f"a multiple of 64 in [64, {MAX_TOPK}]")
        pages = SPARSE_MLA_PAGE_SIZES[self.kv_format]
        _require(c, "page_size", self.page_size, self.page_size in pages,
                 ", ".join(map(str, pages)) + f" (kv_format {self.kv_format!r})")
        _require(c, "mode", self.mode, self.mode in SPARSE_MLA_MODES, ", ".join(SPARSE_MLA_MODES))
        _require(c, "arch", self.arch, self.arch in SUPPORTED_ARCHS, ", ".join(SUPPORTED_ARCHS))
        extra_pages = SPARSE_MLA_EXTRA_PAGE_SIZES.get(self.kv_format, ())
        _require(c, "extra_page_size", self.extra_page_size, self.extra_page_size in (0, *extra_pages),
                 ", ".join(map(str, (0, *extra_pages))) + f" (kv_format {self.kv_format!r}; 0: no extra list)")
        _require(c, "extra_topk", self.extra_topk, isinstance(self.extra_topk, int) and self.extra_topk % 64 == 0
                 and (self.extra_topk == 0) == (self.extra_page_size == 0) and 0 <= self.extra_topk <= MAX_TOPK,
                 f"a multiple of 64 in [64, {MAX_TOPK}] with an extra_page_size, else 0")
        served = SPARSE_MLA_FORMAT_HEADS.get((self.kv_format, self.arch))
        if served is not None:
            _require(c, "num_heads", self.num_heads, self.num_heads in served,
                     (", ".join(map(str, served)) or "none yet") + f" (kv_format {self.kv_format!r} on {self.arch})")

    def _check_head_dims(self, c: str) -> None:
        """The head dims must be one of the kv_format's sets (SPARSE_MLA_HEAD_DIMS). The fields
        are checked in order, each against the values of the sets that match the fields before
        it, so the error names the first field that leaves no set and what it could be."""
        sets = SPARSE_MLA_HEAD_DIMS[self.kv_format]
        for i, f in enumerate(_HEAD_DIM_FIELDS):
            value = getattr(self, f)
            allowed = sorted({d[i] for d in sets})
            _require(c, f, value, value in allowed,
                     ", ".join(map(str, allowed)) + f" (kv_format {self.kv_format!r})")
            sets = tuple(d for d in sets if d[i] == value)

    def tiling(self) -> dict:
        """codegen.tiling.decode_tiling for this spec: its tiles, threads and shared memory."""
        from .cute_blocks.sparse_mla.kv_layout import kv_record
        from .tiling import decode_tiling

        return decode_tiling(self.num_heads, self.kv_format, self.arch, self.mode, d_qk=self.q_head_dim,
                             record_bytes=kv_record(self.kv_format, self.kv_lora_rank, self.rope_dim).raw_bytes,
                             v_in_rope=self.v_head_dim > self.kv_lora_rank)

    @property
    def name(self) -> str:
        page = "" if self.page_size == 64 else f"_p{self.page_size}"
        # head dims other than the format's first set are named (bf16 at DeepSeek-V4's: _d512)
        dims = "" if self._dims() == SPARSE_MLA_HEAD_DIMS[self.kv_format][0] else f"_d{self.q_head_dim}"
        extra = f"_x{self.extra_topk}p{self.extra_page_size}" if self.extra_topk else ""
        return f"sparse_mla_{self.mode}_h{self.num_heads}_k{self.topk}{extra}_{self.kv_format}{dims}{page}_{self.arch}"

    def _dims(self) -> tuple[int, int, int, int]:
        return tuple(getattr(self, f) for f in _HEAD_DIM_FIELDS)

    def template_context(self) -> dict:
        from .tiling import COMBINE_FEW_SPLITS, MAX_SPLITS

        tile = self.tiling()
        return {
            "combine_few_splits": COMBINE_FEW_SPLITS,
            "max_splits": min((self.topk + self.extra_topk) // 64, MAX_SPLITS),
            "num_heads": self.num_heads,
            "kv_format": self.kv_format,
            "topk": self.topk,
            "arch": self.arch,
            "mode": self.mode,
            # the head dims: q and K are d_nope NoPE dims then d_rope RoPE dims (d_qk), V the
            # first d_v dims of K
            "d_qk": self.q_head_dim,
            "d_nope": self.kv_lora_rank,
            "d_rope": self.rope_dim,
            "d_v": self.v_head_dim,
            "page_size": self.page_size,
            "extra_page_size": self.extra_page_size,
            "tile": tile,
            **self.blocks(tile),
        }

    def blocks(self, tile: dict) -> dict:
        """The building blocks the module composes, (module, class) each: the KV format's gather
        for the tiling's form, the MMA form, and the kernel base (two index lists or one)."""
        model1, two = self.kv_format == "model1_fp8", bool(self.extra_page_size)
        if tile["producer"]:
            gather = ("two_lists", "Model1TwoListsProducer") if two else (
                "gather", "Model1Producer" if model1 else "Fp8Producer")
        elif tile["fp8_regs"]:
            gather = ("two_lists", "Model1TwoListsGather") if two else (
                "gather", "Model1RegsGather" if model1 else "Fp8RegsGather")
        elif model1:
            gather = ("two_lists", "Model1TwoListsRaw") if two else ("gather_raw", "Model1RawGather")
        elif self.kv_format == "fp8_ds_mla":
            gather = ("gather_raw", "Fp8RawGather")
        else:
            gather = ("gather", "Bf16Gather")
        if not tile["wgmma"]:
            mma = ("mma_warp", "WarpMma")
        elif tile["heads_as_n"]:
            mma = ("mma_wgmma_heads_n", "WgmmaHeadsAsN")
        else:
            mma = ("mma_wgmma", "Wgmma64Heads")
        base = ("TwoLists" if two else "") + ("ExtendKernel" if self.mode == "extend" else "SplitKernel")
        return {"gather_module": gather[0], "gather_block": gather[1], "mma_module": mma[0], "mma_block": mma[1],
                "kernel_module": "two_lists" if two else "kernel", "kernel_base": base}


@register_family
@dataclass(frozen=True)
class DcpSpec(KernelSpec):
    """The small kernels of the DCP global top-k (position conversion, candidate gather, winner
    finalisation, owner filter). World size, rank, interleave and K are launch arguments."""

    family: ClassVar[str] = "dcp"
    template: ClassVar[str] = "dcp.py.j2"

    arch: str = "sm_90a"

    def __post_init__(self) -> None:
        _require(type(self).__name__, "arch", self.arch, self.arch in SUPPORTED_ARCHS, ", ".join(SUPPORTED_ARCHS))

    @property
    def name(self) -> str:
        return f"dcp_topk_{self.arch}"

    def template_context(self) -> dict:
        return {"arch": self.arch}


from . import indexer_specs  # noqa: E402,F401
