"""Print the markdown table of a benchmark JSON, as benchmarks/RESULTS.md shows it.

    python benchmarks/tables.py {decode,extend,indexer,indexer-prefill,dcp,v4,v4-prefill} RESULT.json

The shares of the roofline are the bench's (benchmarks/roofline.py: 4.3 TB/s, 790 TFLOP/s)."""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.roofline import (BF16_FLOP_PER_S, V4_SWA_ENTRIES, roofline_us, v4_decode_bytes,  # noqa: E402
                                 v4_entries, v4_flops)

NA = "n/a"


def _f(v, fmt: str) -> str:
    return NA if v is None else format(v, fmt)


def _pct(v) -> str:
    if v is None:
        return NA
    return f"{100 * v:.1f}%" if v < 0.1 else f"{100 * v:.0f}%"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def decode_table(data: dict) -> str:
    out = []
    for r in sorted(data["rows"], key=lambda r: (r["batch"], r["heads"])):
        peer = r["peer_fp8_us"]
        out.append([str(r["batch"]), str(r["heads"]), _f(r["ours_fp8_us"], ".1f"), _f(peer, ".1f"),
                    _f(r["ours_fp8_us"] / peer if peer else None, ".2f"), _pct(r["fp8_roofline_share"]),
                    _pct(r["fp8_roofline_share"] * r["ours_fp8_us"] / peer if peer else None),
                    _f(r["ours_bf16_us"], ".1f"), _pct(r["bf16_roofline_share"])])
    return _table(["B", "H", "ours fp8 µs", "FlashMLA fp8 µs", "ratio", "ours % roofline", "FlashMLA % roofline",
                   "ours bf16-KV µs", "bf16-KV % roofline"], out)


def extend_table(data: dict) -> str:
    roof = BF16_FLOP_PER_S / 1e12
    out = []
    # rows of earlier runs have no s_kv (their cache was 131072 tokens) and no fp8 peer
    for r in sorted(data["rows"], key=lambda r: (r.get("skv", 131072), r["s_q"], r["heads"])):
        peer = r["peer_bf16_us"]
        fp8 = r.get("ours_fp8_us")
        out.append([str(r.get("skv", 131072)), str(r["s_q"]), str(r["heads"]), _f(r["ours_bf16_us"], ".0f"),
                    _f(peer, ".0f"), _f(r["ours_bf16_us"] / peer if peer else None, ".2f"),
                    f"{r['bf16_tflops']:.0f} ({r['bf16_tflops'] / roof:.0%})",
                    NA if not r.get("peer_tflops") else f"{r['peer_tflops']:.0f} ({r['peer_tflops'] / roof:.0%})",
                    _f(fp8, ".0f"), NA if not fp8 else f"{r['fp8_tflops']:.0f} ({r['fp8_tflops'] / roof:.0%})",
                    _f(r.get("peer_fp8_total_us"), ".0f"), _f(r.get("ratio_fp8"), ".2f")])
    return _table(["s_kv", "s_q", "H", "ours bf16 µs", "FlashMLA bf16 µs", "ratio", "ours bf16 TFLOP/s (% roofline)",
                   "FlashMLA TFLOP/s (% roofline)", "ours fp8 µs", "ours fp8 TFLOP/s (% roofline)",
                   "dequant + FlashMLA µs", "fp8 ratio"], out)


def indexer_table(data: dict) -> str:
    out = []
    for r in sorted(data["rows"], key=lambda r: (r["next_n"], r["batch"], r["ctx"])):
        dg, dgp = r.get("peer_logits_us"), r.get("peer_pipeline_us")
        out.append([str(r["next_n"]), str(r["batch"]), str(r["ctx"]), _f(r["ours_logits_us"], ".1f"), _f(dg, ".1f"),
                    _f(dg / r["ours_logits_us"] if dg else None, ".2f"), _pct(r["logits_hbm_share"]),
                    _f(r["ours_topk_us"], ".1f"), _f(r["torch_topk_us"], ".1f"), _f(r["topk_speedup"], ".2f"),
                    _pct(r["topk_hbm_share"]), _f(r["ours_pipeline_us"], ".1f"), _f(dgp, ".1f"),
                    _f(dgp / r["ours_pipeline_us"] if dgp else None, ".2f")])
    return _table(["next_n", "B", "L", "ours logits µs", "DeepGEMM µs", "logits ratio", "logits % roofline",
                   "ours top-k µs", "torch.topk µs", "top-k speedup", "top-k % roofline", "ours pipeline µs",
                   "DG + torch µs", "pipeline ratio"], out)


def indexer_prefill_table(data: dict) -> str:
    out = []
    for r in sorted(data["rows"], key=lambda r: (r["rows"], r["ctx"], bool(r.get("group_select")))):
        if r.get("ours_us") is None:                      # a variant that failed (its error in the JSON)
            continue
        peer = r.get("peer_us")
        n = r.get("batch_rows") or r["logits_rows"]       # rows a batch (older runs: the region's)
        out.append([str(r["rows"]), str(r["ctx"]), str(r["c"]), str(r["width"]),
                    "grouped" if r.get("group_select") else "wide", str(n),
                    _f(r["scratch_mib"], ".0f"), _f(r["ours_logits_us"] / 1e3, ".2f"), _f(r["ours_topk_us"] / 1e3, ".2f"),
                    _f(r["ours_us"] / 1e3, ".2f"), _f(r.get("peer_logits_us") and r["peer_logits_us"] / 1e3, ".2f"),
                    _f(peer and peer / 1e3, ".2f"), _f(r.get("peer_bytes_mib"), ".0f"),
                    _f(r["ours_us"] / peer if peer else None, ".2f")])
    return _table(["rows", "context", "c", "entries", "top-k", "N", "ours scratch MiB", "ours logits ms", "ours top-k ms",
                   "ours ms", "DeepGEMM logits ms", "DG + torch.topk ms", "DG logits MiB", "ratio"], out)


def dcp_table(data: dict) -> str:
    nccl = {r["rows"]: r["merge_us"] for r in data.get("nccl") or []}
    out = []
    for r in sorted(data["local"], key=lambda r: r["rows"]):
        out.append([str(r["rows"]), _f(r["ours_local_us"], ".1f"), _f(r["torch_local_us"], ".1f"),
                    _f(r["speedup"], ".2f"), _pct(r["roofline_share"]), _f(nccl.get(r["rows"]), ".1f")])
    return _table(["rows", "ours local µs", "torch ops µs", "speedup", "ours % roofline", "2-GPU merge µs (NCCL)"],
                  out)


def v4_kind_label(kind: str) -> str:
    """'swa' -> 'SWA', 'swa+c4_512' -> 'SWA + C4 512'."""
    if "+" not in kind:
        return "SWA"
    extra, width = kind.split("+", 1)[1].split("_")
    return f"SWA + {extra.upper()} {width}"


def v4_roofline(r: dict) -> float:
    """A V4 decode row's roofline time, µs: its records, q, out and lse at 4.3 TB/s or its FLOPs at
    790 TFLOP/s, whichever is longer (benchmarks/roofline.py)."""
    e = v4_entries(r["kind"])
    return roofline_us(v4_flops(r["rows"], r["heads"], e), v4_decode_bytes(r["rows"], r["heads"], e))


def v4_table(data: dict) -> str:
    out = []
    for r in sorted(data["rows"], key=lambda r: (r["batch"], r["heads"], v4_entries(r["kind"]), "c128" in r["kind"])):
        roof, peer = v4_roofline(r), r.get("peer_us")
        out.append([str(r["batch"]), str(r["heads"]), v4_kind_label(r["kind"]), _f(r["ours_us"], ".1f"),
                    _f(peer, ".1f"), _f(r["ours_us"] / peer if peer else None, ".2f"), _pct(roof / r["ours_us"]),
                    _pct(roof / peer if peer else None)])
    return _table(["B", "H", "layer kind", "ours µs", "FlashMLA µs", "ratio", "ours % roofline",
                   "FlashMLA % roofline"], out)


def v4_prefill_table(data: dict) -> str:
    roof = BF16_FLOP_PER_S / 1e12
    out = []
    for r in sorted(data["rows"], key=lambda r: (r["s_q"], r["heads"])):
        flops = v4_flops(r["s_q"], r["heads"], V4_SWA_ENTRIES + r["c4_topk"])
        ours, attn, total = r["ours_us"], r.get("peer_attn_us"), r.get("peer_total_us")
        t_ours = flops / ours / 1e6
        t_attn = flops / attn / 1e6 if attn else None
        out.append([str(r["s_q"]), str(r["heads"]), str(r["c4_topk"]), _f(ours, ".0f"),
                    _f(r.get("peer_dequant_us"), ".0f"), _f(attn, ".0f"), _f(total, ".0f"),
                    _f(ours / total if total else None, ".2f"), f"{t_ours:.0f} ({t_ours / roof:.0%})",
                    NA if t_attn is None else f"{t_attn:.0f} ({t_attn / roof:.0%})",
                    _f(r.get("ours_bf16_us"), ".0f"), _f(r.get("bf16_ratio"), ".2f")])
    return _table(["s_q", "H", "C4 top-k", "ours µs", "peer dequant µs", "peer FlashMLA µs", "peer total µs",
                   "ratio", "ours TFLOP/s (% roofline)", "FlashMLA attention TFLOP/s (% roofline)",
                   "ours bf16 µs (same workspace)", "bf16 ratio (to FlashMLA attention)"], out)


TABLES = {"decode": decode_table, "extend": extend_table, "indexer": indexer_table,
          "indexer-prefill": indexer_prefill_table, "dcp": dcp_table,
          "v4": v4_table, "v4-prefill": v4_prefill_table}

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=tuple(TABLES))
    ap.add_argument("json")
    a = ap.parse_args()
    with open(a.json) as f:
        data = json.load(f)
    info = data.get("info") or data          # the V4 benches nest the run's header under "info"
    print(f"{info.get('device', 'unknown device')}, {info.get('date', 'undated')}, "
          f"commit {info.get('commit', 'unknown')}")
    print()
    print(TABLES[a.kind](data))
