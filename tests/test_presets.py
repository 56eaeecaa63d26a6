"""The catalog's model presets are each model's whole bundle, prewarm_preset's bundle is exactly
the catalog's specs, and `b12x-codegen list` fits a 100-column terminal."""
import pytest

from b12x.errors import InputError
from b12x.prewarm import DEFAULT_MAX_WIDTH, preset_bundle, prewarm_preset
from codegen.catalog import DEFAULT_PRESET, PRESETS, PresetError, get_preset, model_presets
from codegen.cli import main
from codegen.indexer_specs import IndexerLogitsSpec, IndexerTopKSpec, TopKSpec
from codegen.specs import DcpSpec, SparseMLASpec
from codegen.toolchain import SUPPORTED_ARCHS

# preset -> (model, attention heads per rank, KV format, indexer heads); DESIGN.md "Models served"
MODEL_PRESETS = {
    "deepseek-v3.2-tp1": ("DeepSeek-V3.2", 128, "fp8_ds_mla", 64),
    "deepseek-v3.2-tp2": ("DeepSeek-V3.2", 64, "fp8_ds_mla", 64),
    "deepseek-v3.2-tp4": ("DeepSeek-V3.2", 32, "fp8_ds_mla", 64),
    "deepseek-v3.2-tp8": ("DeepSeek-V3.2", 16, "fp8_ds_mla", 64),
    "deepseek-v3.2-tp8-bf16": ("DeepSeek-V3.2", 16, "bf16", 64),
    "glm-5-tp1": ("GLM-5", 64, "fp8_ds_mla", 32),
    "glm-5-tp2": ("GLM-5", 32, "fp8_ds_mla", 32),
    "glm-5-tp4": ("GLM-5", 16, "fp8_ds_mla", 32),
    "glm-5-tp8": ("GLM-5", 8, "fp8_ds_mla", 32),
    "deepseek-v3.2-tp16": ("DeepSeek-V3.2", 8, "fp8_ds_mla", 64),
}
# DeepSeek-V4 presets -> (model, heads per rank, the C4 indexer's top-k)
V4_PRESETS = {
    **{f"deepseek-v4-flash-tp{tp}": ("DeepSeek-V4-Flash", 64 // tp, 512) for tp in (1, 2, 4, 8)},
    **{f"deepseek-v4-pro-tp{tp}": ("DeepSeek-V4-Pro", 128 // tp, 1024) for tp in (1, 2, 4, 8, 16)},
}
# component presets (tests, benchmarks) keep their bundles: spec counts on sm_90a
COMPONENT_PRESETS = {"sparse-mla-all": 20, "sparse-mla-wide": 8, "deepseek-v3.2-indexer": 8, "glm-5-indexer": 8, "indexer-compressed": 12,
                     "dcp-topk": 2, "indexer-all": 58, "sparse-mla-model1": 16, "sparse-mla-v4-bf16": 10}


def test_model_and_component_presets():
    assert {p.name for p in model_presets()} == set(MODEL_PRESETS) | set(V4_PRESETS)
    assert set(PRESETS) == set(MODEL_PRESETS) | set(V4_PRESETS) | set(COMPONENT_PRESETS)
    for name, (model, *_rest) in MODEL_PRESETS.items():
        assert get_preset(name).model == model
    for name, count in COMPONENT_PRESETS.items():
        assert get_preset(name).model is None
        assert len(get_preset(name).specs(("sm_90a",))) == count, name
    assert DEFAULT_PRESET in MODEL_PRESETS


@pytest.mark.parametrize("arch", SUPPORTED_ARCHS)
@pytest.mark.parametrize("name", sorted(MODEL_PRESETS))
def test_model_preset_is_the_whole_bundle(name, arch):
    _, heads, kv_format, index_heads = MODEL_PRESETS[name]
    want = [SparseMLASpec(num_heads=heads, kv_format=kv_format, topk=2048, mode=m, arch=arch) for m in ("decode", "extend")]
    want += [IndexerLogitsSpec(num_heads=index_heads, compress_ratio=1, mode="paged", arch=arch),
             IndexerLogitsSpec(num_heads=index_heads, mode="contiguous", arch=arch)]
    if arch == "sm_90a":   # row pairs (MTP, prefill) exist on sm_90a only
        want += [IndexerLogitsSpec(num_heads=index_heads, compress_ratio=1, rows_per_unit=2, arch=arch),
                 IndexerLogitsSpec(num_heads=index_heads, mode="contiguous", rows_per_unit=2, arch=arch)]
    want += [TopKSpec(k=2048, with_scores=s, arch=arch) for s in (False, True)]
    want += [IndexerTopKSpec(num_heads=index_heads, compress_ratio=1, k=2048, with_scores=s, arch=arch)
             for s in (False, True)]
    want.append(DcpSpec(arch=arch))
    got = get_preset(name).specs((arch,))
    assert len(got) == len(set(got))
    assert set(got) == set(want), {"missing": [s.name for s in set(want) - set(got)],
                                   "extra": [s.name for s in set(got) - set(want)]}


def test_default_preset_specs():
    names = [s.name for s in get_preset(DEFAULT_PRESET).specs(("sm_90a",))]
    assert DEFAULT_PRESET == "deepseek-v3.2-tp8"
    assert names == [
        "sparse_mla_decode_h16_k2048_fp8_ds_mla_sm_90a",           # decode
        "sparse_mla_extend_h16_k2048_fp8_ds_mla_sm_90a",           # extend (prefill, MTP verify)
        "indexer_logits_paged_h64_c1_sm_90a",                      # paged logits
        "indexer_logits_paged_h64_c1_g2_sm_90a",                   # row pairs (rows_per_unit=2)
        "indexer_logits_contiguous_h64_c1_sm_90a",                 # contiguous (prefill) logits
        "indexer_logits_contiguous_h64_c1_g2_sm_90a",              # its row pairs
        "topk_k2048_w262144_sm_90a",                               # top-k
        "topk_k2048_w262144_scores_sm_90a",                        # top-k with scores
        "indexer_topk_h64_c1_k2048_w262144_sm_90a",                # fused
        "indexer_topk_h64_c1_k2048_w262144_scores_sm_90a",         # fused with scores
        "dcp_topk_sm_90a",                                         # DCP convert / merge / filter
    ]


@pytest.mark.parametrize("arch", SUPPORTED_ARCHS)
@pytest.mark.parametrize("name", list(PRESETS))
def test_prewarm_bundle_is_the_catalog_bundle(name, arch):
    """What prewarm_preset resolves (from the runtime's own plans) is exactly the preset's specs:
    nothing built goes unwarmed, and nothing warmed is missing from the build. A preset without
    kernels for the arch says so."""
    if arch not in get_preset(name).archs:
        with pytest.raises(InputError, match=f"arch: preset '{name}' has kernels for"):
            preset_bundle(name, arch=arch, num_sms=132, max_rows=64)
        return
    b = preset_bundle(name, arch=arch, num_sms=132, max_rows=64)
    assert set(b.specs()) == set(get_preset(name).specs((arch,)))
    assert (b.dcp is not None) == any(isinstance(s, DcpSpec) for s in b.specs())
    assert b.max_width == DEFAULT_MAX_WIDTH and b.scratch_bytes() > 0


def test_default_bundle_routes():
    b = preset_bundle(DEFAULT_PRESET, arch="sm_90a", num_sms=132, max_rows=256)
    assert [(k.num_heads, k.kv_format, k.topk, k.max_rows) for k in b.sparse_mla] == [(16, "fp8_ds_mla", 2048, 256)]
    assert {(c.num_heads, c.mode, c.compress_ratio, c.with_scores) for c in b.indexer} == {
        (64, m, 1, s) for m in ("paged", "contiguous") for s in (False, True)}
    assert all(c.max_rows == 256 and c.max_width == DEFAULT_MAX_WIDTH for c in b.indexer)
    assert (b.dcp.topk, b.dcp.world, b.dcp.max_rows) == (2048, 1, 256)


def test_preset_bundle_errors():
    with pytest.raises(PresetError, match="unknown preset 'nope'"):
        preset_bundle("nope", arch="sm_90a", num_sms=132, max_rows=8)
    with pytest.raises(InputError, match="dcp_group: preset 'sparse-mla-all' has no DCP kernels"):
        preset_bundle("sparse-mla-all", arch="sm_90a", num_sms=132, max_rows=8, dcp_world=2)
    with pytest.raises(InputError, match="max_rows: expected an int >= 1, got 0"):
        preset_bundle(DEFAULT_PRESET, arch="sm_90a", num_sms=132, max_rows=0)
    with pytest.raises(InputError, match="max_width: expected an int in"):
        preset_bundle(DEFAULT_PRESET, arch="sm_90a", num_sms=132, max_rows=8, max_width=1 << 20)
    with pytest.raises(PresetError, match="unknown preset 'nope'"):
        prewarm_preset("nope", max_rows=8)   # before any device query


def _lines(capsys):
    out = capsys.readouterr()
    return out.out.splitlines(), out.err


@pytest.mark.parametrize("arch", ["sm_90a", "sm_90a,sm_120a"])
def test_cli_list_fits_100_columns(capsys, arch):
    assert main(["list", "--arch", arch]) == 0
    lines, _ = _lines(capsys)
    assert max(len(line) for line in lines) <= 100
    assert lines[0].split() == ["preset", "model", "specs", "what"]
    for name, p in PRESETS.items():
        row = next(line for line in lines if line.split()[0].rstrip("*") == name)
        assert row.split()[1] == (p.model or "-") and row.split()[2] == str(len(p.specs(tuple(arch.split(",")))))
        assert (row.split()[0].endswith("*")) == (name == DEFAULT_PRESET)
    assert "sparse_mla_decode" not in "\n".join(lines)   # no spec-name lists


@pytest.mark.parametrize("arch", ["sm_90a", "sm_90a,sm_120a"])
@pytest.mark.parametrize("name", list(PRESETS))
def test_cli_list_preset_shows_its_specs(capsys, name, arch):
    assert main(["list", name, "--arch", arch]) == 0
    lines, _ = _lines(capsys)
    assert max(len(line) for line in lines) <= 100
    head = next(i for i, line in enumerate(lines) if line.split() == ["spec", "arch", "family", "what"])
    rows = {line.split()[0]: line.split() for line in lines[head + 2:]}
    specs = get_preset(name).specs(tuple(arch.split(",")))
    assert len(rows) == len(specs)
    for s in specs:
        assert rows[s.name][1:3] == [s.arch, s.family]


def test_cli_list_unknown_preset(capsys):
    assert main(["list", "nope"]) == 2
    lines, err = _lines(capsys)
    assert lines == [] and err.count("\n") == 1 and "unknown preset 'nope'" in err


def test_cli_prewarm_calls_prewarm_preset(capsys, monkeypatch):
    """On a GPU box without the DSL compiler, `prewarm` loads from the cache via prewarm_preset."""
    import torch

    import b12x.prewarm
    from b12x import registry

    calls = []

    def fake(name, **kw):
        calls.append((name, kw))
        return preset_bundle(name, arch="sm_90a", num_sms=132, **kw)

    monkeypatch.setattr(registry, "dsl_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(b12x.prewarm, "prewarm_preset", fake)
    with pytest.warns(DeprecationWarning, match="max_batched"):     # --max-batched: the old flag
        assert main(["prewarm", "--preset", "glm-5-tp2", "--max-batched", "64"]) == 0
    assert calls == [("glm-5-tp2", {"max_batched": 64, "max_width": DEFAULT_MAX_WIDTH})]
    out = capsys.readouterr().out
    assert "prewarmed preset glm-5-tp2 on sm_90a: 11 specs loaded and launched" in out


def test_prewarm_preset_orchestration(monkeypatch):
    """prewarm_preset's sequence with the device calls stubbed: every artifact resolved before any
    launch, then sparse MLA, every indexer route, the DCP warm-up with the group's world and rank;
    memoised once it succeeded."""
    import contextlib

    import torch
    import torch.distributed as dist

    import b12x.prewarm as pw

    events = []
    monkeypatch.setattr(pw, "device_arch", lambda device: "sm_90a")
    monkeypatch.setattr(pw, "device_num_sms", lambda device: 132)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append("sync"))
    monkeypatch.setattr(pw._scratch, "check", lambda scratch, need, device: events.append(("scratch", need)))
    monkeypatch.setattr(pw.registry, "resolve", lambda spec: events.append(("resolve", spec)))
    monkeypatch.setattr(pw, "prewarm_sparse_mla", lambda **kw: events.append(("mla", kw["num_heads"], kw["kv_format"])))
    monkeypatch.setattr(pw, "prewarm_indexer", lambda caps, **kw: events.append(("indexer", caps)))
    monkeypatch.setattr(pw, "_prewarm_dcp", lambda caps, scratch, rank, max_batched, group, device:
                        events.append(("dcp", caps.world, caps.interleave, rank, group)))
    monkeypatch.setattr(dist, "get_world_size", lambda group: 2)
    monkeypatch.setattr(dist, "get_rank", lambda group: 1)
    ws = torch.empty(16, dtype=torch.uint8)
    kw = dict(max_rows=16, max_width=4096, device="cuda:0", dcp_group="group", dcp_interleave=8, scratch=ws)
    bundle = pw.prewarm_preset("glm-5-tp2", **kw)
    resolved = [e[1] for e in events if e[0] == "resolve"]
    assert set(resolved) == set(get_preset("glm-5-tp2").specs(("sm_90a",))) and len(resolved) == 11
    first_launch = next(i for i, e in enumerate(events) if e[0] in ("mla", "indexer", "dcp"))
    assert all(e[0] == "resolve" for e in events[:len(resolved)]) and first_launch > len(resolved)
    assert [e for e in events if e[0] == "mla"] == [("mla", 32, "fp8_ds_mla")]
    assert [e[1] for e in events if e[0] == "indexer"] == list(bundle.indexer) and len(bundle.indexer) == 4
    assert all(c.num_heads == 32 and c.max_rows == 16 and c.max_width == 4096 for c in bundle.indexer)
    assert [e for e in events if e[0] == "dcp"] == [("dcp", 2, 8, 1, "group")]
    assert events[-1] == "sync"
    n = len(events)
    assert pw.prewarm_preset("glm-5-tp2", **kw) == bundle and len(events) == n    # memoised


def test_a_preset_limited_to_some_archs_has_none_elsewhere():
    """Preset.archs bounds a bundle's archs (every catalog preset has both today)."""
    from codegen.catalog import Preset

    full = get_preset("sparse-mla-model1")
    assert full.archs == SUPPORTED_ARCHS and len(full.specs(SUPPORTED_ARCHS)) == 32
    only = Preset("x", "x", full.configs, archs=("sm_90a",))
    assert only.specs(("sm_120a",)) == [] and len(only.specs(SUPPORTED_ARCHS)) == 16


@pytest.mark.parametrize("name", sorted(V4_PRESETS))
def test_v4_preset_is_the_whole_bundle(name):
    """A DeepSeek-V4 bundle: decode and extend of each layer kind (sliding window alone, + C4 at
    the indexer's top-k, + every C128 entry), the 64-head c = 4 indexer at its top-k, DCP; sm_90a."""
    model, heads, k = V4_PRESETS[name]
    p = get_preset(name)
    assert p.model == model and len(p.specs(("sm_120a",))) == 13    # the same less the row-pair logits
    v4 = dict(q_head_dim=512, kv_lora_rank=448, rope_dim=64, v_head_dim=512, kv_format="model1_fp8", page_size=256,
              topk=512, num_heads=heads, arch="sm_90a")
    want = [SparseMLASpec(**v4, mode=m, extra_topk=xk, extra_page_size=xp)
            for xk, xp in ((0, 0), (k, 64), (8192, 2)) for m in ("decode", "extend")]
    want += [IndexerLogitsSpec(num_heads=64, compress_ratio=4, mode="paged", arch="sm_90a"),
             IndexerLogitsSpec(num_heads=64, compress_ratio=4, rows_per_unit=2, arch="sm_90a"),
             IndexerLogitsSpec(num_heads=64, mode="contiguous", arch="sm_90a"),
             IndexerLogitsSpec(num_heads=64, mode="contiguous", rows_per_unit=2, arch="sm_90a")]
    # the top-k artifacts serve every K up to 2048 (a launch argument)
    want += [TopKSpec(k=2048, with_scores=s, arch="sm_90a") for s in (False, True)]
    want += [IndexerTopKSpec(num_heads=64, compress_ratio=4, k=2048, with_scores=s, arch="sm_90a") for s in (False, True)]
    want.append(DcpSpec(arch="sm_90a"))
    assert set(p.specs(("sm_90a",))) == set(want)
    b = preset_bundle(name, arch="sm_90a", num_sms=132, max_rows=64)
    assert set(b.specs()) == set(want)


def test_cli_build_only_builds_the_matching_specs(monkeypatch, capsys):
    """--only hands build_specs just the preset's specs whose names hold a fragment, and a
    fragment that matches nothing is a clear error before anything is built."""
    import codegen.build as build
    from codegen.cli import main

    seen = []
    monkeypatch.setattr(build, "build_specs", lambda specs, cache, jobs, progress: seen.extend(specs) or [])
    assert main(["build", "--preset", "sparse-mla-all", "--only", "decode_h8_,extend_h16_k2048_bf16"]) == 0
    assert sorted(s.name for s in seen) == ["sparse_mla_decode_h8_k2048_bf16_sm_90a",
                                            "sparse_mla_decode_h8_k2048_fp8_ds_mla_sm_90a",
                                            "sparse_mla_extend_h16_k2048_bf16_sm_90a"]
    seen.clear()
    assert main(["build", "--preset", "dcp-topk", "--only", "nothing_like_it"]) == 2
    assert not seen
    assert "nothing_like_it" in capsys.readouterr().err
