"""Plot a benchmark JSON (bench_sparse_mla_decode/extend.py, bench_indexer.py --json) into a PNG beside RESULTS.md."""
from __future__ import annotations

import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_decode(data: dict, path: str) -> None:
    rows = data["rows"]
    heads = sorted({r["heads"] for r in rows})
    fig, axes = plt.subplots(1, len(heads), figsize=(4 * len(heads), 3.6), sharey=False)
    for ax, h in zip(axes, heads):
        rs = sorted((r for r in rows if r["heads"] == h), key=lambda r: r["batch"])
        b = [r["batch"] for r in rs]
        ax.plot(b, [r["ours_fp8_us"] for r in rs], "o-", label="b12x fp8")
        if any(r["peer_fp8_us"] for r in rs):
            label = "FlashMLA fp8" + (" (q padded to 64 heads)" if h < 64 else "")
            ax.plot(b, [r["peer_fp8_us"] for r in rs], "s--", label=label)
        ax.plot(b, [r["ours_bf16_us"] for r in rs], "^:", label="b12x bf16 KV")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"h={h}, top-k 2048")
        ax.set_xlabel("batch (rows)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("µs per call (median, CUDA graph)")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"sparse MLA decode on {data['device']} ({data['date']}, {data['commit'][:10]})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_extend(data: dict, path: str) -> None:
    rows = data["rows"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, s_q in zip(axes, sorted({r["s_q"] for r in rows})):
        rs = sorted((r for r in rows if r["s_q"] == s_q), key=lambda r: r["heads"])
        h = [r["heads"] for r in rs]
        ax.plot(h, [r["bf16_tflops"] for r in rs], "o-", label="b12x bf16 KV")
        ax.plot(h, [r["fp8_tflops"] for r in rs], "^:", label="b12x fp8 KV")
        if any(r["peer_tflops"] for r in rs):
            ax.plot(h, [r["peer_tflops"] or float("nan") for r in rs], "s--",
                    label="FlashMLA bf16 (h<64: padded to 64; useful FLOPs)")
        ax.set_xscale("log", base=2)
        ax.set_title(f"s_q={s_q}, top-k 2048")
        ax.set_xlabel("heads")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("TFLOP/s (useful)")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"sparse MLA extend on {data['device']} ({data['date']}, {data['commit'][:10]})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_indexer(data: dict, path: str) -> None:
    """Top-k speedup over torch.topk and pipeline speedup over DeepGEMM + torch.topk, per context."""
    rows = data["rows"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for (ax, key, floor, title) in ((axes[0], "topk", 3.0, "top-k alone: torch.topk / b12x"),
                                    (axes[1], "pipeline", 1.3, "logits + top-k: (DeepGEMM + torch.topk) / b12x")):
        for n in sorted({r["next_n"] for r in rows}):
            for b in sorted({r["batch"] for r in rows}):
                rs = sorted((r for r in rows if r["batch"] == b and r["next_n"] == n), key=lambda r: r["ctx"])
                if key == "topk":
                    y = [r["topk_speedup"] for r in rs]
                else:
                    y = [r["peer_pipeline_us"] / r["ours_pipeline_us"] if r["peer_pipeline_us"] else float("nan")
                         for r in rs]
                ax.plot([r["ctx"] for r in rs], y, "o-" if n == 1 else "s--", label=f"B={b}, next_n={n}")
        ax.axhline(floor, color="k", lw=0.8, ls=":")
        ax.set_xscale("log", base=2)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("context (tokens)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("speedup (dotted: the floor)")
    axes[1].legend(fontsize=6, ncol=2)
    fig.suptitle(f"lightning indexer, H=64, K=2048, on {data['device']} ({data['date']}, {data['commit'][:10]})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=("decode", "extend", "indexer"))
    ap.add_argument("json")
    ap.add_argument("png")
    a = ap.parse_args()
    with open(a.json) as f:
        {"decode": plot_decode, "extend": plot_extend, "indexer": plot_indexer}[a.kind](json.load(f), a.png)
