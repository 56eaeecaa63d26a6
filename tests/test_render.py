import ast

from codegen.catalog import all_catalog_specs
from codegen.emit import stale
from codegen.render import header, render, template_hash
from codegen.specs import SparseMLASpec


def test_render_is_deterministic_and_records_spec():
    for spec in (SparseMLASpec(num_heads=16), SparseMLASpec(num_heads=128, kv_format="bf16", arch="sm_120a")):
        a, b = render(spec), render(spec)
        assert a == b
        assert a.startswith(header(spec))
        assert spec.canonical_json() in a and template_hash(spec.template) in a
        ast.parse(a)  # valid Python
        assert "ENTRY_POINTS" in a


def test_specs_render_differently():
    texts = {render(s) for s in all_catalog_specs()}
    assert len(texts) == len(all_catalog_specs())


def test_generated_is_fresh():
    assert stale() == [], "generated/ is stale: run `b12x-codegen emit`"


def _config(text: str) -> dict:
    """The module-level integer constants of a rendered module."""
    return {t.id: n.value.value for n in ast.parse(text).body if isinstance(n, ast.Assign)
            for t in n.targets if isinstance(t, ast.Name) and isinstance(n.value, ast.Constant)}


def test_rendered_config_carries_the_spec_head_dims(monkeypatch):
    """The head dims reach the kernel config from the spec, not from constants of the blocks:
    a head-dim set added to the format table renders into D_* and the kernel's attributes."""
    import codegen.specs as specs

    text = render(SparseMLASpec(num_heads=64))
    cfg = _config(text)
    assert (cfg["D_QK"], cfg["D_NOPE"], cfg["D_ROPE"], cfg["D_V"]) == (576, 512, 64, 512)
    for attr, const in (("d_qk", "D_QK"), ("d_nope", "D_NOPE"), ("d_rope", "D_ROPE"), ("d_v", "D_V")):
        assert f"self.{attr} = {const}" in text

    monkeypatch.setitem(specs.SPARSE_MLA_HEAD_DIMS, "bf16", ((576, 512, 64, 512), (512, 448, 64, 512)))
    spec = SparseMLASpec(q_head_dim=512, kv_lora_rank=448, rope_dim=64, v_head_dim=512, num_heads=16,
                         kv_format="bf16")
    cfg = _config(render(spec))
    assert (cfg["D_QK"], cfg["D_NOPE"], cfg["D_ROPE"], cfg["D_V"]) == (512, 448, 64, 512)
    # the tiling sizes shared memory from the spec's dims (Q and K rows of 512 bf16 dims)
    v32 = SparseMLASpec(num_heads=16, kv_format="bf16")
    assert spec.tiling()["smem_bytes_estimate"] < v32.tiling()["smem_bytes_estimate"]
