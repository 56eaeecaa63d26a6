"""Catalog of presets: named model configurations and the kernel specs that serve them.

A preset is what an engine deploys (a model at a tensor-parallel degree); its specs are the
bundle that `b12x.prewarm` makes ready for it."""
from __future__ import annotations

from dataclasses import dataclass

from .indexer_specs import INDEXER_HEADS, IndexerLogitsSpec, IndexerTopKSpec, TopKSpec
from .specs import KV_FORMATS, SPARSE_MLA_HEADS, SPARSE_MLA_MODES, DcpSpec, KernelSpec, SparseMLASpec
from .toolchain import SUPPORTED_ARCHS

DEFAULT_PRESET = "deepseek-v3.2-tp8"


@dataclass(frozen=True)
class ModelConfig:
    """One attention configuration: heads per rank, KV format, top-k width."""

    num_heads: int
    kv_format: str = "fp8_ds_mla"
    topk: int = 2048

    def specs(self, arch: str) -> list[KernelSpec]:
        """Decode and extend: an engine's prewarm bundle routes between them by rows per request."""
        return [SparseMLASpec(num_heads=self.num_heads, kv_format=self.kv_format, topk=self.topk, mode=m, arch=arch)
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
        out += [TopKSpec(k=self.topk, with_scores=s, arch=arch) for s in (False, True)]
        out += [IndexerTopKSpec(num_heads=self.num_heads, compress_ratio=c, k=self.topk, with_scores=s, arch=arch)
                for c in self.compress_ratios for s in (False, True)]
        return out


@dataclass(frozen=True)
class DcpConfig:
    """DCP global top-k: the conversion/merge/filter kernels and the top-k with scores they run."""

    topk: int = 2048

    def specs(self, arch: str) -> list[KernelSpec]:
        return [DcpSpec(arch=arch), TopKSpec(k=self.topk, with_scores=True, arch=arch)]


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    configs: tuple[ModelConfig | IndexerConfig | DcpConfig, ...]

    def specs(self, archs: tuple[str, ...] = ("sm_90a",)) -> list[KernelSpec]:
        out: list[KernelSpec] = []
        for arch in archs:
            for cfg in self.configs:
                for s in cfg.specs(arch):
                    if s not in out:
                        out.append(s)
        return out


def _tp_presets(model: str, heads_tp1: int, degrees: tuple[int, ...], what: str) -> list[Preset]:
    return [Preset(f"{model}-tp{tp}", f"{what} at TP{tp}: {heads_tp1 // tp} heads per rank, fp8_ds_mla KV, top-k 2048",
                   (ModelConfig(heads_tp1 // tp),)) for tp in degrees]


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        *_tp_presets("deepseek-v3.2", 128, (1, 2, 4, 8), "DeepSeek-V3.2"),
        *_tp_presets("glm-5", 64, (1, 2, 4), "GLM-5 style (64 heads)"),
        Preset("deepseek-v3.2-tp8-bf16", "DeepSeek-V3.2 at TP8 with a bf16 latent cache", (ModelConfig(16, "bf16"),)),
        Preset("sparse-mla-all", "every head count and KV format of sparse MLA decode and extend (tests, benchmarks)",
               tuple(ModelConfig(h, f) for f in KV_FORMATS for h in SPARSE_MLA_HEADS)),
        Preset("deepseek-v3.2-indexer", "V3.2 lightning indexer: 64 index heads, top-k 2048", (IndexerConfig(64),)),
        Preset("glm-5-indexer", "GLM-5 lightning indexer: 32 index heads, top-k 2048", (IndexerConfig(32),)),
        Preset("indexer-compressed", "compressed indexer caches (c = 4, 128), 64 heads", (IndexerConfig(64, (4, 128)),)),
        Preset("dcp-topk", "DCP global top-k merge: position conversion, candidate top-k with scores, owner filter",
               (DcpConfig(),)),
        Preset("indexer-all", "every indexer head count and compress ratio (tests, benchmarks)",
               tuple(IndexerConfig(h, (1, 4, 128)) for h in INDEXER_HEADS)),
    ]
}


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
