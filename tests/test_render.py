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
