"""The README's engine, indexer and DCP examples, and the vLLM adapter's docstring example, call
b12x functions that exist, with keyword arguments they take (checked by binding each call against
its signature; tests/readme_blocks.py). tests/gpu/test_readme_examples_gpu.py runs the examples."""
import ast

import pytest
import torch

import b12x
import b12x.integration.vllm as vllm_adapter
from readme_blocks import (README_SECTIONS, check_calls, docstring_code, inline_b12x_calls, python_block,
                           readme_text)

SM = "b12x.attention.sparse_mla"
# The calls each example must show (and that must therefore exist as written).
REQUIRED = {
    "engine": {f"{SM}.Caps", f"{SM}.plan", f"{SM}.SparseMLAPlan.scratch_bytes", f"{SM}.SparseMLAPlan.bind",
               f"{SM}.run_decode", f"{SM}.run_extend", "b12x.registry.freeze"},
    "v4": {f"{SM}.v4_caps", f"{SM}.plan", f"{SM}.SparseMLAPlan.bind", f"{SM}.run_decode",
           "b12x.metadata.CompressedEntries", "b12x.metadata.CompressedEntries.fill"},
    "indexer": {"b12x.indexer.Caps", "b12x.indexer.plan", "b12x.indexer.IndexerPlan.scratch_bytes",
                "b12x.indexer.IndexerPlan.bind", "b12x.indexer.run_index_topk", "b12x.prewarm.prewarm"},
    "dcp": {"b12x.dcp.allocate_topk_buffers", "b12x.dcp.DcpCaps", "b12x.dcp.plan", "b12x.dcp.DcpPlan.scratch_bytes",
            "b12x.prewarm.prewarm", "b12x.dcp.DcpPlan.bind", "b12x.dcp.run_merge", "b12x.dcp.filter_local"},
    "upstream": {"b12x.integration.sparse_mla_scratch.B12XSparseMLAScratchCaps",
                 "b12x.integration.sparse_mla_scratch.plan_sparse_mla_scratch",
                 "b12x.integration.sparse_mla_scratch.B12XSparseMLAScratchPlan.bind",
                 "b12x.integration.mla.sparse_mla_decode_forward",
                 "b12x.attention.indexer.B12XIndexerScratchCaps", "b12x.attention.indexer.plan_indexer_scratch",
                 "b12x.attention.indexer.B12XIndexerScratchPlan.bind", "b12x.attention.indexer.index_topk_fp8"},
}
# What the README says the adapter's docstring shows.
ADAPTER = "b12x.integration.vllm"
REQUIRED_ADAPTER = {"b12x.dcp.allocate_topk_buffers", f"{ADAPTER}.SparseIndexer.topk",
                    f"{ADAPTER}.SparseIndexer.dcp_global_topk", f"{ADAPTER}.SparseMLA.decode", f"{ADAPTER}.prewarm",
                    "b12x.metadata.decode_active_width", "b12x.registry.freeze", f"{ADAPTER}.SparseMLAV4",
                    f"{ADAPTER}.SparseMLAV4.decode"}


@pytest.mark.parametrize("section", sorted(README_SECTIONS))
def test_readme_block_calls_exist(section):
    errors, checked = check_calls(python_block(section), f"README.md '{README_SECTIONS[section]}' block")
    assert not errors, "\n".join(errors)
    missing = REQUIRED[section] - set(checked)
    assert not missing, f"the README '{README_SECTIONS[section]}' block no longer calls {sorted(missing)}"


def test_readme_engine_block_prewarms_then_freezes():
    checked = check_calls(python_block("engine"), "engine")[1]
    prewarms = [i for i, n in enumerate(checked) if n.startswith("b12x.prewarm.prewarm")]
    assert prewarms and prewarms[0] < checked.index("b12x.registry.freeze"), checked


def test_readme_inline_calls_exist():
    calls = inline_b12x_calls()
    assert any("decode_active_width" in c for c in calls), calls
    for c in calls:
        errors, checked = check_calls(f"import b12x\n{c}\n", f"README.md inline `{c[:40]}...`")
        assert not errors and checked, "\n".join(errors) or f"nothing checked in {c}"


def test_vllm_docstring_calls_exist():
    env = {n: getattr(vllm_adapter, n) for n in dir(vllm_adapter) if not n.startswith("_")}
    env.update(b12x=b12x, torch=torch)
    errors, checked = check_calls(docstring_code(vllm_adapter.__doc__), "b12x.integration.vllm docstring", env)
    assert not errors, "\n".join(errors)
    missing = REQUIRED_ADAPTER - set(checked)
    assert not missing, f"the adapter docstring does not show {sorted(missing)}"


def test_extraction_finds_each_block_under_its_heading():
    text = readme_text()
    for section, heading in README_SECTIONS.items():
        code = python_block(section, text)
        ast.parse(code)
        assert code.strip() and code in text, section
    assert "prewarm(p" in python_block("indexer") and "run_merge" in python_block("dcp")


def test_checker_catches_what_it_is_for():
    """Each kind of README rot the static check exists to catch is reported."""
    eng = python_block("engine")
    cases = {"lengths=topk_lengths": "length=topk_lengths",              # unknown keyword / missing argument
             "sparse_mla.run_extend(": "sparse_mla.run_extnd(",           # missing function
             "plan.scratch_bytes()": "plan.scratch_size()",               # missing method of a returned object
             "b12x.freeze()": "b12x.freeze(True)"}                        # extra positional argument
    for good, bad in cases.items():
        assert good in eng, good
        errors, _ = check_calls(eng.replace(good, bad), "mutated")
        assert errors, f"not caught: {bad}"
    errors, _ = check_calls("mla = SparseMLA(num_heads=16)\nmla.decode(q, kv, idx, n, out=o, scratch=ws)\n", "adapter",
                            {"SparseMLA": vllm_adapter.SparseMLA})
    assert errors and "sm_scale" in errors[0], errors
    assert check_calls("f(x, y=1, ...)\n", "syntax")[0]
