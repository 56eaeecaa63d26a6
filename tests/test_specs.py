import pytest

from codegen.catalog import PRESETS, PresetError, get_preset, parse_archs
from codegen.specs import KernelSpec, SparseMLASpec, SpecError


@pytest.mark.parametrize("field,value,allowed", [
    ("num_heads", 48, "16, 32, 64, 128"),
    ("topk", 100, "multiple of 64"),
    ("topk", 8256, "multiple of 64 in [64, 8192]"),   # past the widest row a spec serves
    ("kv_format", "fp16", "fp8_ds_mla, bf16"),
    ("arch", "sm_80", "sm_90a, sm_120a"),
    ("page_size", 32, "64"),
    ("mode", "train", "decode"),
    ("kv_lora_rank", 256, "512"),
])
def test_validation_names_field_and_allowed_values(field, value, allowed):
    with pytest.raises(SpecError) as e:
        SparseMLASpec(**{field: value})
    msg = str(e.value)
    assert e.value.field == field
    assert f"SparseMLASpec.{field}" in msg and repr(value) in msg and allowed in msg


def test_canonical_json_roundtrip_and_identity():
    a = SparseMLASpec(num_heads=16, kv_format="bf16")
    b = KernelSpec.from_json(a.canonical_json())
    assert a == b and hash(a) == hash(b)
    assert a.canonical_json() == b.canonical_json()
    assert '"family":"sparse_mla"' in a.canonical_json()
    assert SparseMLASpec(num_heads=32).canonical_json() != a.canonical_json()


def test_catalog_has_required_presets():
    heads = {get_preset(f"deepseek-v3.2-tp{tp}").configs[0].num_heads for tp in (1, 2, 4, 8)}
    assert heads == {128, 64, 32, 16}
    assert any(name.startswith("glm-5") for name in PRESETS)


def test_unknown_preset_and_arch_errors():
    with pytest.raises(PresetError, match="unknown preset 'nope'; known presets: .*deepseek-v3.2-tp8"):
        get_preset("nope")
    with pytest.raises(PresetError, match="--arch: got 'sm_75'"):
        parse_archs("sm_75")
    assert parse_archs("sm_90a, sm_120a") == ("sm_90a", "sm_120a")


def test_sparse_mla_topk_up_to_8192_and_the_split_cap():
    """Index rows up to 8192 are a spec field; the planner never makes more splits than the
    combine merges (codegen.tiling.MAX_SPLITS), wide rows get more tiles per split instead."""
    from b12x.attention.sparse_mla import split_plan
    from codegen.render import render
    from codegen.tiling import MAX_SPLITS

    for topk in (2560, 4096, 8192):
        assert SparseMLASpec(topk=topk).topk == topk
    for rows in (1, 2, 4, 8, 64):
        for width in (2048, 4096, 8192):
            s, tokens = split_plan(rows, width, 132, 1)
            assert 1 <= s <= MAX_SPLITS and s * tokens >= width
    assert "MAX_SPLITS = 32" in render(SparseMLASpec(topk=8192))
    assert "MAX_SPLITS = 4" in render(SparseMLASpec(topk=256))


@pytest.mark.parametrize("dims,field,allowed", [
    (dict(q_head_dim=512, kv_lora_rank=448), "q_head_dim", "576"),            # DeepSeek-V4: not served yet
    (dict(rope_dim=128), "rope_dim", "64"),
    (dict(v_head_dim=576), "v_head_dim", "512"),
    (dict(kv_format="bf16", kv_lora_rank=448), "kv_lora_rank", "512"),
])
def test_head_dims_outside_the_format_table_name_the_field(dims, field, allowed):
    with pytest.raises(SpecError) as e:
        SparseMLASpec(**dims)
    assert e.value.field == field
    fmt = dims.get("kv_format", "fp8_ds_mla")
    assert f"SparseMLASpec.{field}" in str(e.value) and allowed in str(e.value) and fmt in str(e.value)


def test_head_dim_table_covers_every_format():
    from codegen.specs import KV_FORMATS, SPARSE_MLA_HEAD_DIMS

    assert set(SPARSE_MLA_HEAD_DIMS) == set(KV_FORMATS)
    for sets in SPARSE_MLA_HEAD_DIMS.values():
        for q, nope, rope, v in sets:
            assert q == nope + rope and v <= q


def test_bf16_serves_deepseek_v4_dims_under_their_own_name():
    """bf16 KV at DeepSeek-V4's dims (the cache engines dequantise model1_fp8 to): a spec of its
    own name (the format's first dims keep theirs), V over the RoPE block, so P is kept beside
    the one K stage of the 8-32-head extend instead of in that block."""
    v4 = dict(q_head_dim=512, kv_lora_rank=448, rope_dim=64, v_head_dim=512, kv_format="bf16")
    assert SparseMLASpec(num_heads=16, kv_format="bf16", mode="extend").name == "sparse_mla_extend_h16_k2048_bf16_sm_90a"
    s = SparseMLASpec(num_heads=16, mode="extend", **v4)
    assert s.name == "sparse_mla_extend_h16_k2048_bf16_d512_sm_90a"
    t, t576 = s.tiling(), SparseMLASpec(num_heads=16, kv_format="bf16", mode="extend").tiling()
    assert t["stages"] == t576["stages"] == 1 and t576["p_in_rope"] and not t["p_in_rope"] and t["p_stages"] == 1
    for h in (8, 32, 64, 128):
        assert not SparseMLASpec(num_heads=h, mode="extend", **v4).tiling()["p_in_rope"]
    with pytest.raises(SpecError) as e:
        SparseMLASpec(**{**v4, "kv_lora_rank": 512})
    assert e.value.field == "kv_lora_rank" and "448" in str(e.value)


def test_bf16_at_v4_dims_plans_binds_and_checks_its_pages():
    """The facade takes the V4 dims for a bf16 cache: plans name the _d512 artifacts, bind takes
    [rows, H, 512] q, and the cache check wants 512 bf16 values a token."""
    import torch

    from b12x.attention import sparse_mla as sm
    from b12x.errors import InputError

    for mode in ("decode", "extend"):
        p = sm.plan(sm.Caps(num_heads=16, kv_format="bf16", **sm.V4_HEAD_DIMS, arch="sm_90a", num_sms=132,
                            max_rows=4, mode=mode))
        assert all(s.name.endswith("_bf16_d512_sm_90a") for s in p.specs())
    scr = torch.empty(p.scratch_bytes(), dtype=torch.uint8)
    b = p.bind(scr, q=torch.zeros(2, 16, 512, dtype=torch.bfloat16), indices=torch.zeros(2, 64, dtype=torch.int32),
               lengths=torch.zeros(2, dtype=torch.int32))
    assert b.out.shape == (2, 16, 512)
    sm.check_kv_cache(torch.zeros(3, 64, 512, dtype=torch.bfloat16), "bf16", torch.device("cpu"), kv_lora_rank=448,
                      rope_dim=64)
    with pytest.raises(InputError, match=r"kv_cache: expected shape \(\*, 64, 512\)"):
        sm.check_kv_cache(torch.zeros(3, 64, 576, dtype=torch.bfloat16), "bf16", torch.device("cpu"),
                          kv_lora_rank=448, rope_dim=64)
    # a q of the format's other dims names the plan's and how to plan for them
    with pytest.raises(InputError, match=r"q: expected last dim Caps.q_head_dim=512 .* got 576: bf16 also serves "
                                         r"q_head_dim=576, plan with Caps\(\.\.\., q_head_dim=576, kv_lora_rank=512"):
        p.bind(scr, q=torch.zeros(2, 16, 576, dtype=torch.bfloat16), indices=torch.zeros(2, 64, dtype=torch.int32),
               lengths=torch.zeros(2, dtype=torch.int32))
    p576 = sm.plan(sm.Caps(num_heads=16, kv_format="bf16", arch="sm_90a", num_sms=132, max_rows=4))
    with pytest.raises(InputError, match=r"q_head_dim=576 .* got 512: .* kv_lora_rank=448, rope_dim=64, v_head_dim=512"):
        p576.bind(torch.empty(p576.scratch_bytes(), dtype=torch.uint8), q=torch.zeros(2, 16, 512, dtype=torch.bfloat16),
                  indices=torch.zeros(2, 64, dtype=torch.int32), lengths=torch.zeros(2, dtype=torch.int32))
    with pytest.raises(InputError, match="q: expected shape"):      # no set of the format has that dim
        p.bind(scr, q=torch.zeros(2, 16, 500, dtype=torch.bfloat16), indices=torch.zeros(2, 64, dtype=torch.int32),
               lengths=torch.zeros(2, dtype=torch.int32))


def test_spec_names_are_unique_across_head_dim_sets():
    """Every head-dim set of every format names its specs apart (the name is the artifact's file,
    module and registry name): two sets may not share the dims the name spells."""
    from codegen.specs import SPARSE_MLA_HEAD_DIMS

    names = {}
    for fmt, sets in SPARSE_MLA_HEAD_DIMS.items():
        for q, nope, rope, v in sets:
            for mode in ("decode", "extend"):
                for arch in ("sm_90a", "sm_120a"):
                    kw = dict(num_heads=64, kv_format=fmt, mode=mode, arch=arch, q_head_dim=q, kv_lora_rank=nope,
                              rope_dim=rope, v_head_dim=v)
                    if fmt == "model1_fp8":
                        kw["page_size"] = 256
                    s = SparseMLASpec(**kw)
                    assert names.setdefault(s.name, s) == s, f"{s.name} names two specs"


def test_fp8_extend_at_32_heads_runs_the_heads_as_n_beside_two_producers():
    """fp8 extend at 32 heads (fp8_ds_mla and model1_fp8): one MMA warpgroup with the heads as N
    beside two producer warpgroups (384 threads, one CTA an SM, the roles' setmaxnreg within the
    launch's pool). 8 and 16 heads keep the register form (two CTAs an SM, no producer), decode at
    32 heads its split form (fp8_ds_mla) or its 64-head producer block (model1_fp8)."""
    from codegen.cute_blocks.sparse_mla.kernel import role_registers

    v4 = dict(kv_format="model1_fp8", q_head_dim=512, kv_lora_rank=448, rope_dim=64, v_head_dim=512, page_size=256,
              topk=512)
    # P in the K stage's RoPE block, except where V spans the RoPE dims (model1_fp8's V is all 512
    # dims): one P buffer a stage there
    for kw, p_in_rope, p_stages in (({}, True, 1), (v4, False, 2)):
        t = SparseMLASpec(num_heads=32, mode="extend", **kw).tiling()
        assert t["heads_as_n"] and t["producer"] and t["producer_warpgroups"] == 2
        assert (t["head_block"], t["warps_n"], t["stages"], t["num_threads"], t["ctas_per_sm"]) == (32, 1, 2, 384, 1)
        assert t["sm_share"] is None and (t["p_in_rope"], t["p_stages"]) == (p_in_rope, p_stages)
        pool = 65536 // t["num_threads"] // 8 * 8
        assert sum(role_registers(True)) * 128 <= pool * t["num_threads"]
    for h in (8, 16):
        r = SparseMLASpec(num_heads=h, mode="extend").tiling()
        assert r["heads_as_n"] and r["fp8_regs"] and not r["producer"] and r["ctas_per_sm"] == 2
    d = SparseMLASpec(num_heads=32, mode="decode").tiling()
    assert d["heads_as_n"] and not d["producer"] and d["raw_stages"] == 2
    m = SparseMLASpec(num_heads=32, mode="decode", **v4).tiling()
    assert m["producer"] and not m["heads_as_n"] and m["head_block"] == 64
