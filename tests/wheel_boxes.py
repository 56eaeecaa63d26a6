"""The two boxes of tests/test_wheel.py, run inside their venvs (copied out of the checkout first,
so nothing of the checkout is importable):

    python wheel_boxes.py build-keys OUT.json   # build box: every catalog key, by rendering
    python wheel_boxes.py serve KEYS.json       # serving box: no jinja2, no DSL compiler

Each prints one JSON object on its last line."""
import importlib.util
import json
import sys

ARCH, SMS = "sm_90a", 132


def _where() -> dict:
    import b12x
    import codegen

    return {"b12x": b12x.__file__, "codegen": codegen.__file__, "source_tree": codegen.SOURCE_TREE}


def build_keys(out: str) -> None:
    from b12x.artifact_cache import artifact_key
    from b12x.loader import runtime_library_path
    from codegen.catalog import all_catalog_specs
    from codegen.identity import can_render

    assert can_render(), "the build box must render (jinja2 and the shipped templates)"
    keys = {s.canonical_json(): artifact_key(s) for s in all_catalog_specs()}
    body = {"keys": keys, "runtime": runtime_library_path(), **_where()}
    with open(out, "w") as f:
        json.dump(body, f)
    print(json.dumps({"specs": len(keys), **_where()}))


def serve(keys_path: str) -> None:
    for mod in ("jinja2", "cutlass", "nvidia_cutlass_dsl"):
        assert importlib.util.find_spec(mod) is None, f"the serving box must not have {mod}"
    built = json.load(open(keys_path))["keys"]

    import tvm_ffi

    import b12x
    from b12x import dcp, indexer, registry
    from b12x.artifact_cache import ArtifactCache, artifact_key
    from b12x.attention import sparse_mla
    from b12x.errors import ArtifactMissingError
    from codegen.catalog import DEFAULT_PRESET, all_catalog_specs, get_preset
    from codegen.identity import can_render
    from codegen.specs import DcpSpec, SparseMLASpec

    import b12x.integration.vllm  # noqa: F401  (the engine adapter imports without jinja2 too)
    import b12x.prewarm  # noqa: F401

    assert not can_render()
    # every catalog key, from the shipped index, equals the build box's rendered key
    served = {s.canonical_json(): artifact_key(s) for s in all_catalog_specs()}
    assert served == built, sorted(k for k in built if served.get(k) != built[k])[:3]

    # plan() of every op, and the keys of every spec the plans name
    plans = {
        "sparse_mla decode": sparse_mla.plan(sparse_mla.Caps(num_heads=16, max_rows=256, arch=ARCH, num_sms=SMS)),
        "sparse_mla extend": sparse_mla.plan(sparse_mla.Caps(num_heads=16, max_rows=8192, mode="extend",
                                                             arch=ARCH, num_sms=SMS)),
        "indexer": indexer.plan(indexer.Caps(num_heads=64, max_rows=128, with_scores=True, arch=ARCH, num_sms=SMS)),
        "dcp": dcp.plan(dcp.DcpCaps(topk=2048, world=2, max_rows=64, arch=ARCH, num_sms=SMS), device="cuda"),
    }
    named = [plans["sparse_mla decode"].spec, plans["sparse_mla extend"].spec, *plans["indexer"].specs(),
             DcpSpec(arch=ARCH), *plans["dcp"].topk_plan.specs()]
    for name, p in plans.items():
        assert p.scratch_bytes() > 0, name
    for s in named:
        assert artifact_key(s) == built[s.canonical_json()], s.name

    # resolve() of the default bundle loads each .so from the copied cache (no GPU needed to load)
    cache = ArtifactCache()
    loaded = []
    for spec in get_preset(DEFAULT_PRESET).specs((ARCH,)):
        k = registry.resolve(spec)
        assert k.artifact.key == built[spec.canonical_json()] and k.artifact.dir.is_relative_to(cache.root)
        assert k.functions and all(isinstance(f, tvm_ffi.Function) for f in k.functions.values()), spec.name
        loaded.append(f"{spec.name}: {', '.join(k.functions)}")

    # a catalog spec that was not built is an error, not a build; a spec outside the catalog
    # cannot be keyed here, and says what to do
    bundle = set(get_preset(DEFAULT_PRESET).specs((ARCH,)))
    unbuilt = next(s for s in all_catalog_specs() if s.arch == ARCH and s not in bundle)
    try:
        registry.resolve(unbuilt)
        raise AssertionError(f"resolved {unbuilt.name}, which the build box never built")
    except ArtifactMissingError as e:
        assert "no usable artifact" in str(e) and "b12x-codegen build" in str(e), e
    try:
        registry.resolve(SparseMLASpec(num_heads=16, topk=1024, arch=ARCH))
        raise AssertionError("keyed a spec that is not in the source index")
    except ArtifactMissingError as e:
        assert "not in the source index" in str(e) and "b12x-codegen emit" in str(e), e

    b12x.freeze()
    assert registry.resolve(get_preset(DEFAULT_PRESET).specs((ARCH,))[0]) is not None
    leaked = [m for m in sys.modules if m.split(".")[0] in ("jinja2", "cutlass") and sys.modules[m] is not None]
    assert not leaked, leaked
    print(json.dumps({"catalog_keys": len(served), "planned": sorted(plans), "loaded": loaded, **_where()}))


if __name__ == "__main__":
    {"build-keys": build_keys, "serve": serve}[sys.argv[1]](*sys.argv[2:])
