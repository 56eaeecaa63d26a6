"""Catalog of presets: named bundles of kernel specs.

A model preset is what an engine deploys (a model at a tensor-parallel degree); its specs are
the whole bundle that `b12x.prewarm.prewarm_preset` makes ready for it. Component presets group
one kernel family for tests and benchmarks."""
from __future__ import annotations

from dataclasses import dataclass

from .indexer_specs import INDEXER_HEADS, TOPK_MAX, IndexerLogitsSpec, IndexerTopKSpec, TopKSpec
from .specs import SPARSE_MLA_HEAD_DIMS, SPARSE_MLA_HEADS, SPARSE_MLA_MODES, DcpSpec, KernelSpec, SparseMLASpec
from .toolchain import SUPPORTED_ARCHS

DEFAULT_PRESET = "deepseek-v3.2-tp8"
V32_FORMATS = ("fp8_ds_mla", "bf16")    # the KV formats of DeepSeek-V3.2 / GLM-5


@dataclass(frozen=True)
class ModelConfig:
    """Sparse MLA attention of one model configuration: heads per rank, KV format, top-k width."""

    num_heads: int
    kv_format: str = "fp8_ds_mla"
    topk: int = 2048
    page_size: int = 64
    extra_topk: int = 0          # DeepSeek-V4 layers with a compressed cache: the extra list
    extra_page_size: int = 0
    # (q_head_dim, kv_lora_rank, rope_dim, v_head_dim): one of the format's sets
    # (SPARSE_MLA_HEAD_DIMS); None: its first
    dims: tuple[int, int, int, int] | None = None

    @property
    def head_dims(self) -> tuple[int, int, int, int]:
        return self.dims or SPARSE_MLA_HEAD_DIMS[self.kv_format][0]

    def specs(self, arch: str) -> list[KernelSpec]:
        """Decode and extend: an engine's prewarm bundle routes between them by rows per request."""
        q, nope, rope, v = self.head_dims
        return [SparseMLASpec(q_head_dim=q, kv_lora_rank=nope, rope_dim=rope, v_head_dim=v, num_heads=self.num_heads,
                              kv_format=self.kv_format, topk=self.topk, page_size=self.page_size, mode=m, arch=arch,
                              extra_topk=self.extra_topk, extra_page_size=self.extra_page_size)
                for m in SPARSE_MLA_MODES]


@dataclass(frozen=True)
class IndexerConfig:
    """A lightning indexer: paged logits per compress ratio, contiguous prefill logits, top-k
    with and without scores, and the fused small-batch score+select path."""

    num_heads: int
    compress_ratios: tuple[int, ...] = (1,)
    topk: int = 2048

    def specs(self, arch: str) -> list[KernelSpec]:
        out: list[KernelSpec] = [IndexerLogitsSpec(num_heads=self.num_heads, compress_ratio=c, arch=arch)
                                 for c in self.compress_ratios]
        if arch == "sm_90a":    # MTP rows: two rows of a request per staged K page
            out += [IndexerLogitsSpec(num_heads=self.num_heads, compress_ratio=c, rows_per_unit=2, arch=arch)
                    for c in self.compress_ratios]
        out.append(IndexerLogitsSpec(num_heads=self.num_heads, mode="contiguous", arch=arch))
        if arch == "sm_90a":    # prefill rows: two rows per staged K page
            out.append(IndexerLogitsSpec(num_heads=self.num_heads, mode="contiguous", rows_per_unit=2, arch=arch))
        # the top-k artifacts serve every K up to TOPK_MAX (K is a launch argument): the model's
        # topk picks the K prewarm launches, not the artifact
        out += [TopKSpec(k=TOPK_MAX, with_scores=s, arch=arch) for s in (False, True)]
        out += [IndexerTopKSpec(num_heads=self.num_heads, compress_ratio=c, k=TOPK_MAX, with_scores=s, arch=arch)
                for c in self.compress_ratios for s in (False, True)]
        return out


@dataclass(frozen=True)
class DcpConfig:
    """DCP global top-k: the conversion/merge/filter kernels and the top-k with scores they run."""

    topk: int = 2048

    def specs(self, arch: str) -> list[KernelSpec]:
        return [DcpSpec(arch=arch), TopKSpec(k=TOPK_MAX, with_scores=True, arch=arch)]


@dataclass(frozen=True)
class Preset:
    """A named bundle of kernel specs.

    A model preset (`model` set) is what an engine deploys: one model at one tensor-parallel
    degree. Its bundle is every kernel that model's layers call: sparse MLA decode and extend,
    the lightning indexer (paged logits, MTP row pairs on sm_90a, contiguous prefill logits, top-k
    with and without scores, the fused path) and the DCP global top-k, so that
    `b12x.prewarm.prewarm_preset` can load and launch all of it before freeze(). A component
    preset (`model` None) groups kernels of one family for tests and benchmarks."""

    name: str
    description: str
    configs: tuple[ModelConfig | IndexerConfig | DcpConfig, ...]
    model: str | None = None
    archs: tuple[str, ...] = SUPPORTED_ARCHS    # the archs whose kernels the bundle has

    def specs(self, archs: tuple[str, ...] = ("sm_90a",)) -> list[KernelSpec]:
        out: list[KernelSpec] = []
        for arch in (a for a in archs if a in self.archs):
            for cfg in self.configs:
                for s in cfg.specs(arch):
                    if s not in out:
                        out.append(s)
        return out


@dataclass(frozen=True)
class ServedModel:
    """A model of DESIGN.md's "Models served": attention heads at TP1, the indexer, and the
    tensor-parallel degrees whose heads per rank sparse MLA runs natively."""

    name: str
    slug: str
    heads_tp1: int
    index_heads: int
    degrees: tuple[int, ...]
    topk: int = 2048


# The indexer is replicated over tensor-parallel ranks (its heads are not sharded), so every
# degree of a model runs the same indexer.
DEEPSEEK_V32 = ServedModel("DeepSeek-V3.2", "deepseek-v3.2", heads_tp1=128, index_heads=64, degrees=(1, 2, 4, 8, 16))
GLM5 = ServedModel("GLM-5", "glm-5", heads_tp1=64, index_heads=32, degrees=(1, 2, 4, 8))


def model_preset(m: ServedModel, tp: int, kv_format: str = "fp8_ds_mla", suffix: str = "") -> Preset:
    heads = m.heads_tp1 // tp
    return Preset(f"{m.slug}-tp{tp}{suffix}",
                  f"{heads} heads {kv_format}, indexer {m.index_heads} heads c=1, top-k {m.topk}",
                  (ModelConfig(heads, kv_format, m.topk), IndexerConfig(m.index_heads, (1,), m.topk),
                   DcpConfig(m.topk)),
                  model=m.name)


@dataclass(frozen=True)
class V4Model:
    """A DeepSeek-V4 model: model1_fp8 pages, three layer kinds (sliding window alone; plus the C4
    cache and its indexer's top-k; plus every C128 entry), a 64-head c = 4 indexer, at each
    tensor-parallel degree (its heads per rank: heads_tp1 / degree)."""

    name: str
    slug: str
    heads_tp1: int
    topk: int                       # the C4 indexer's top-k: the C4 layers' extra width
    degrees: tuple[int, ...]
    swa_topk: int = 512             # main (sliding-window) rows: 128 in the models, up to 512
    swa_page: int = 256
    c4_page: int = 64
    c128_topk: int = 8192           # every C128 entry of a 1M-token context
    c128_page: int = 2
    index_heads: int = 64


DEEPSEEK_V4_FLASH = V4Model("DeepSeek-V4-Flash", "deepseek-v4-flash", heads_tp1=64, topk=512, degrees=(1, 2, 4, 8))
DEEPSEEK_V4_PRO = V4Model("DeepSeek-V4-Pro", "deepseek-v4-pro", heads_tp1=128, topk=1024, degrees=(1, 2, 4, 8, 16))


def v4_preset(m: V4Model, tp: int) -> Preset:
    heads = m.heads_tp1 // tp
    mla = lambda **kw: ModelConfig(heads, "model1_fp8", topk=m.swa_topk, page_size=m.swa_page, **kw)  # noqa: E731
    return Preset(f"{m.slug}-tp{tp}",
                  f"{heads} heads model1_fp8: SWA, +C4 {m.topk}, +C128; indexer {m.index_heads} heads c=4, top-k {m.topk}",
                  (mla(), mla(extra_topk=m.topk, extra_page_size=m.c4_page),
                   mla(extra_topk=m.c128_topk, extra_page_size=m.c128_page),
                   IndexerConfig(m.index_heads, (4,), m.topk), DcpConfig(m.topk)),
                  model=m.name)


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        *(model_preset(DEEPSEEK_V32, tp) for tp in DEEPSEEK_V32.degrees),
        *(model_preset(GLM5, tp) for tp in GLM5.degrees),
        model_preset(DEEPSEEK_V32, 8, "bf16", "-bf16"),
        *(v4_preset(m, tp) for m in (DEEPSEEK_V4_FLASH, DEEPSEEK_V4_PRO) for tp in m.degrees),
        Preset("sparse-mla-all", "sparse MLA decode + extend: all heads, both KV formats",
               tuple(ModelConfig(h, f) for f in V32_FORMATS for h in SPARSE_MLA_HEADS)),
        Preset("sparse-mla-wide", "sparse MLA, index rows up to 8192: 16, 128 heads",
               tuple(ModelConfig(h, f, topk=8192) for f in V32_FORMATS for h in (16, 128))),
        # DeepSeek-V4's format at 8 and 16 heads: both main page sizes, and both extra lists
        Preset("sparse-mla-model1", "sparse MLA over model1_fp8 pages (DeepSeek-V4): 8, 16 heads, pages 64, 256; "
               "main alone, + C4 (1024, page 64), + C128 (8192, page 2)",
               tuple(ModelConfig(h, "model1_fp8", page_size=p) for h in (8, 16) for p in (64, 256))
               + tuple(ModelConfig(h, "model1_fp8", topk=512, page_size=256, extra_topk=xk, extra_page_size=xp)
                       for h in (8, 16) for xk, xp in ((1024, 64), (8192, 2)))),
        # bf16 KV at DeepSeek-V4's head dims (512 = 448 + 64, V all 512): the cache engines
        # dequantise model1_fp8 pages to for prefill; extend and decode, every head count
        Preset("sparse-mla-v4-bf16", "sparse MLA over bf16 KV at DeepSeek-V4's head dims (d_qk 512): all heads",
               tuple(ModelConfig(h, "bf16", dims=SPARSE_MLA_HEAD_DIMS["bf16"][1]) for h in SPARSE_MLA_HEADS)),
        Preset("deepseek-v3.2-indexer", "V3.2 lightning indexer: 64 index heads, top-k 2048", (IndexerConfig(64),)),
        Preset("glm-5-indexer", "GLM-5 lightning indexer: 32 index heads, top-k 2048", (IndexerConfig(32),)),
        Preset("indexer-compressed", "compressed indexer caches (c = 4, 128), 64 heads", (IndexerConfig(64, (4, 128)),)),
        Preset("dcp-topk", "DCP global top-k: convert, merge, owner filter",
               (DcpConfig(),)),
        Preset("indexer-all", "indexer: every head count and compress ratio",
               tuple(IndexerConfig(h, (1, 4, 128)) for h in INDEXER_HEADS)),
    ]
}


def model_presets() -> list[Preset]:
    return [p for p in PRESETS.values() if p.model is not None]


def spec_role(spec: KernelSpec) -> str:
    """What a spec does in its bundle, in a few words (for `b12x-codegen list PRESET`)."""
    if isinstance(spec, SparseMLASpec):
        return f"attention {spec.mode}"
    if isinstance(spec, IndexerLogitsSpec):
        return f"{spec.mode} logits" + (" (row pairs)" if spec.rows_per_unit == 2 else "")
    if isinstance(spec, TopKSpec):
        return "top-k" + (" + scores" if spec.with_scores else "")
    if isinstance(spec, IndexerTopKSpec):
        return "fused top-k" + (" + scores" if spec.with_scores else "")
    if isinstance(spec, DcpSpec):
        return "DCP merge/filter"
    return spec.family


class PresetError(KeyError):
    def __str__(self) -> str:
        return self.args[0]


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise PresetError(f"unknown preset {name!r}; known presets: {', '.join(PRESETS)}") from None


def parse_archs(text: str) -> tuple[str, ...]:
    archs = tuple(a.strip() for a in text.split(",") if a.strip())
    bad = [a for a in archs if a not in SUPPORTED_ARCHS]
    if bad or not archs:
        raise PresetError(f"--arch: got {text!r}; allowed: a comma-separated list of {', '.join(SUPPORTED_ARCHS)}")
    return archs


def all_catalog_specs() -> list[KernelSpec]:
    """Every spec of every preset, for every supported arch: what generated/ holds."""
    out: list[KernelSpec] = []
    for p in PRESETS.values():
        for s in p.specs(SUPPORTED_ARCHS):
            if s not in out:
                out.append(s)
    return out
