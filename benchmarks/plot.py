"""Plot a benchmark JSON (bench_sparse_mla_decode/extend.py, bench_indexer.py, bench_dcp.py,
bench_sparse_mla_v4.py --json) into the PNG that benchmarks/RESULTS.md shows, with the roofline and
the commit measured.

    python benchmarks/plot.py {decode,extend,indexer,indexer-prefill,dcp,v4} RESULT.json OUT.png

The commit in the title is the JSON's; a JSON without one (older runs wrote "unknown") takes
$B12X_COMMIT, else the checkout's HEAD, and says so on stderr."""
from __future__ import annotations

import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.roofline import BF16_FLOP_PER_S, HBM_BYTES_PER_S, commit  # noqa: E402
from benchmarks.tables import v4_entries, v4_kind_label, v4_roofline  # noqa: E402

ROOF = dict(color="k", lw=1.0, ls="-.")


def info(data: dict) -> dict:
    """The run's header: top-level in most JSONs, under "info" in the V4 benches'."""
    return data.get("info") or data


def run_commit(data: dict) -> str:
    c = str(info(data).get("commit") or "unknown")
    if c != "unknown":
        return c
    c = commit()
    print(f"plot: the JSON names no commit; using {c} ($B12X_COMMIT or the checkout's HEAD)", file=sys.stderr)
    return c


def title(data: dict, what: str) -> str:
    i = info(data)
    return f"{what} on {i.get('device', 'unknown device')} ({i.get('date', 'undated')}, {run_commit(data)[:10]})"


def plot_decode(data: dict, path: str) -> None:
    """µs per call against batch, one panel per head count; the roofline is the fp8 call's
    bytes at 4.3 TB/s or its FLOPs at 790 TFLOP/s, whichever is longer."""
    rows = data["rows"]
    heads = sorted({r["heads"] for r in rows})
    fig, axes = plt.subplots(1, len(heads), figsize=(4 * len(heads), 3.6), sharey=False, squeeze=False)
    axes = axes[0]
    for ax, h in zip(axes, heads):
        rs = sorted((r for r in rows if r["heads"] == h), key=lambda r: r["batch"])
        b = [r["batch"] for r in rs]
        ax.plot(b, [r["ours_fp8_us"] for r in rs], "o-", label="b12x fp8 KV")
        if any(r["peer_fp8_us"] for r in rs):
            label = "FlashMLA fp8 KV" + (" (q padded to 64 heads)" if h < 64 else "")
            ax.plot(b, [r["peer_fp8_us"] or float("nan") for r in rs], "s--", label=label)
        ax.plot(b, [r["ours_bf16_us"] for r in rs], "^:", label="b12x bf16 KV")
        ax.plot(b, [r["ours_fp8_us"] * r["fp8_roofline_share"] for r in rs], **ROOF, label="roofline (fp8 KV)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"h={h}, top-k 2048")
        ax.set_xlabel("batch (rows)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("µs per call (median, CUDA graph)")
    axes[0].legend(fontsize=7)
    fig.suptitle(title(data, "sparse MLA decode"))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_extend(data: dict, path: str) -> None:
    """Useful TFLOP/s against heads, one panel per s_q, under the 790 TFLOP/s bf16 roofline."""
    rows = data["rows"]
    sqs = sorted({r["s_q"] for r in rows})
    fig, axes = plt.subplots(1, len(sqs), figsize=(5 * len(sqs), 3.9), squeeze=False)
    axes = axes[0]
    skvs = sorted({r.get("skv", 131072) for r in rows})
    for ax, s_q in zip(axes, sqs):
        for i, skv in enumerate(skvs):        # a line per cache size (older runs: one, 131072 tokens)
            rs = sorted((r for r in rows if r["s_q"] == s_q and r.get("skv", 131072) == skv), key=lambda r: r["heads"])
            h = [r["heads"] for r in rs]
            tag = f", {skv // 1024}K cache" if len(skvs) > 1 else ""
            color = dict(color=f"C{i}")
            ax.plot(h, [r["bf16_tflops"] for r in rs], "o-", **color, label=f"b12x bf16 KV{tag}")
            if any(r.get("fp8_tflops") for r in rs):
                ax.plot(h, [r.get("fp8_tflops") or float("nan") for r in rs], "^:", **color, label=f"b12x fp8 KV{tag}")
            if any(r["peer_tflops"] for r in rs):
                ax.plot(h, [r["peer_tflops"] or float("nan") for r in rs], "s--", **color,
                        label=f"FlashMLA bf16 KV (h<64: padded to 64; useful FLOPs){tag}")
        ax.axhline(BF16_FLOP_PER_S / 1e12, **ROOF, label=f"roofline ({BF16_FLOP_PER_S / 1e12:.0f} TFLOP/s bf16)")
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, BF16_FLOP_PER_S / 1e12 * 1.08)
        ax.set_title(f"s_q={s_q}, top-k 2048")
        ax.set_xlabel("heads")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("TFLOP/s (useful)")
    handles, labels = axes[0].get_legend_handles_labels()
    ncol = 3 if len(labels) > 4 else len(labels)
    legend_rows = -(-len(labels) // ncol)
    fig.set_figheight(3.9 + 0.25 * legend_rows)
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=ncol)
    fig.suptitle(title(data, "sparse MLA extend"))
    fig.tight_layout(rect=(0, 0.06 * legend_rows, 1, 1))
    fig.savefig(path, dpi=110)


def plot_indexer(data: dict, path: str) -> None:
    """Logits as a share of the HBM roofline (ours and DeepGEMM), then the top-k and pipeline
    speedups against their floors, per context."""
    rows = data["rows"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    groups = [(n, b) for n in sorted({r["next_n"] for r in rows}) for b in sorted({r["batch"] for r in rows})]
    for n, b in groups:
        rs = sorted((r for r in rows if r["batch"] == b and r["next_n"] == n), key=lambda r: r["ctx"])
        ctx = [r["ctx"] for r in rs]
        style = "o-" if n == 1 else "s--"
        line, = axes[0].plot(ctx, [100 * r["logits_hbm_share"] for r in rs], style, label=f"B={b}, next_n={n}")
        axes[0].plot(ctx, [100 * r["logits_hbm_share"] * r["ours_logits_us"] / r["peer_logits_us"]
                           if r.get("peer_logits_us") else float("nan") for r in rs], ":", color=line.get_color(),
                     lw=0.8)
        axes[1].plot(ctx, [r["topk_speedup"] for r in rs], style, color=line.get_color())
        axes[2].plot(ctx, [r["peer_pipeline_us"] / r["ours_pipeline_us"] if r.get("peer_pipeline_us") else float("nan")
                           for r in rs], style, color=line.get_color())
    axes[0].axhline(100, **ROOF, label=f"roofline ({HBM_BYTES_PER_S / 1e12:.1f} TB/s)")
    axes[0].set_title("logits: % of the HBM roofline (dotted: DeepGEMM)", fontsize=9)
    axes[0].set_ylabel("% of roofline")
    axes[0].set_ylim(0, 110)
    for ax, floor, name in ((axes[1], 3.0, "top-k alone: torch.topk / b12x"),
                            (axes[2], 1.3, "logits + top-k: (DeepGEMM + torch.topk) / b12x")):
        ax.axhline(floor, color="k", lw=0.8, ls=":")
        ax.set_title(f"{name} (dotted: the floor, {floor:g}x)", fontsize=9)
        ax.set_ylabel("speedup")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (tokens)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=6, ncol=2, loc="lower right")
    fig.suptitle(title(data, f"lightning indexer, H=64, K=2048, DeepGEMM {data.get('deep_gemm', '?')}"))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_dcp(data: dict, path: str) -> None:
    """The local part of the merge (ours and the same steps in torch ops) against rows, with its
    HBM roofline, and the whole 2-GPU merge with its NCCL all-gather where it ran."""
    k, world = data.get("k", 2048), data.get("world", 2)
    local = sorted(data["local"], key=lambda r: r["rows"])
    rows = [r["rows"] for r in local]
    fig, ax = plt.subplots(figsize=(6, 3.8))
    ax.plot(rows, [r["ours_local_us"] for r in local], "o-", label="b12x, local part (graph replay)")
    ax.plot(rows, [r["torch_local_us"] for r in local], "s--", label="torch ops, local part")
    if data.get("nccl"):
        nccl = sorted(data["nccl"], key=lambda r: r["rows"])
        ax.plot([r["rows"] for r in nccl], [r["merge_us"] for r in nccl], "^:", label="b12x merge_topk, 2 GPUs (NCCL)")
    ax.plot(rows, [r["ours_local_us"] * r["roofline_share"] for r in local], **ROOF,
            label=f"roofline, local part ({HBM_BYTES_PER_S / 1e12:.1f} TB/s)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("rows")
    ax.set_ylabel("µs per call (median)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(title(data, f"DCP global top-k, K={k}, W={world}"), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_v4(data: dict, path: str) -> None:
    """DeepSeek-V4 decode: µs per call against batch, a row of panels per layer kind (SWA, + C4,
    + C128) and a column per head count, with the roofline (benchmarks/tables.py v4_roofline)."""
    rows = data["rows"]
    heads = sorted({r["heads"] for r in rows})
    groups = ("swa", "swa+c4", "swa+c128")
    fig, axes = plt.subplots(len(groups), len(heads), figsize=(4 * len(heads), 3.1 * len(groups)), squeeze=False)
    for i, g in enumerate(groups):
        for ax, h in zip(axes[i], heads):
            rs = sorted((r for r in rows if r["heads"] == h and r["kind"].split("_")[0] == g),
                        key=lambda r: r["batch"])
            if not rs:
                ax.set_visible(False)
                continue
            b = [r["batch"] for r in rs]
            ax.plot(b, [r["ours_us"] for r in rs], "o-", label="b12x model1_fp8")
            ax.plot(b, [r["peer_us"] or float("nan") for r in rs], "s--",
                    label="FlashMLA MODEL1" + (" (q padded to 64 heads)" if h < 64 else ""))
            ax.plot(b, [v4_roofline(r) for r in rs], **ROOF, label="roofline")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"h={h}, {v4_kind_label(rs[0]['kind'])} ({v4_entries(rs[0]['kind'])} entries)", fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            if i == len(groups) - 1:
                ax.set_xlabel("batch (2 rows each: MTP)")
            if h == heads[0]:
                ax.set_ylabel("µs per call (median)")
            if i == 0:
                ax.legend(fontsize=6)
    fig.suptitle(title(data, "DeepSeek-V4 sparse MLA decode (model1_fp8, s_q = 2)"))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_indexer_prefill(data: dict, path: str) -> None:
    """Per prefill case, ms: ours (the overlapped total) beside the peer (DeepGEMM logits, then
    torch.topk), with the roofline: the logits' FLOPs at the fp8 tensor rate (2 x the measured
    bf16 rate) or their bytes at 4.3 TB/s (K and q read, the fp32 logits written and read once),
    whichever is longer."""
    rows = [r for r in data["rows"] if r.get("ours_us") is not None]    # (a failed variant has none)
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    xs = range(len(rows))
    ours = [r["ours_us"] / 1e3 for r in rows]
    dg = [(r["peer_logits_us"] or float("nan")) / 1e3 for r in rows]
    dg_topk = [((r["peer_us"] or float("nan")) - (r["peer_logits_us"] or float("nan"))) / 1e3 for r in rows]
    ax.bar([x - 0.2 for x in xs], ours, 0.38, label="b12x logits + top-k (row batches, overlapped)")
    ax.bar([x + 0.2 for x in xs], dg, 0.38, label="DeepGEMM logits")
    ax.bar([x + 0.2 for x in xs], dg_topk, 0.38, bottom=dg, label="torch.topk")
    for x, r in zip(xs, rows):
        entries = sum((r["ctx"] - r["rows"] + i + 1) // r["c"] for i in range(r["rows"]))
        flops = 2 * entries * 64 * 128
        nbytes = r["width"] * 132 + r["rows"] * 64 * 132 + 2 * 4 * entries
        roof = max(flops / (2 * BF16_FLOP_PER_S), nbytes / HBM_BYTES_PER_S) * 1e3
        ax.hlines(roof, x - 0.42, x + 0.42, **ROOF, label="roofline" if x == 0 else None)
        if r.get("ratio"):
            ax.annotate(f"{r['ratio']:.2f}x", (x - 0.2, r["ours_us"] / 1e3), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs), [f"{r['rows']} rows x {r['ctx'] // 1024}K, c {r['c']}\n{r['scratch_mib']:.0f} MiB"
                             + (", grouped" if r.get("group_select") else "") for r in rows], fontsize=8)
    ax.set_ylabel("ms")
    ax.set_yscale("log")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(title(data, "indexer prefill, H=64, K=2048 (annotated: ours / peer)"), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


PLOTS = {"decode": plot_decode, "extend": plot_extend, "indexer": plot_indexer, "dcp": plot_dcp, "v4": plot_v4,
         "indexer-prefill": plot_indexer_prefill}

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=tuple(PLOTS))
    ap.add_argument("json")
    ap.add_argument("png")
    a = ap.parse_args()
    with open(a.json) as f:
        PLOTS[a.kind](json.load(f), a.png)
