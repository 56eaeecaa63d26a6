"""CUDA-graph timing with rotated inputs (METHOD: graphs remove launch gaps, rotation beats L2)."""
from __future__ import annotations

import statistics
from typing import Callable, Sequence

import torch


def time_rotated(calls: Sequence[Callable[[], object]], replays: int = 30, warmup: int = 3) -> float:
    """Median microseconds per call. `calls` are launches over distinct input sets; one graph
    runs them all back to back, so consecutive calls never see each other's data in L2."""
    for fn in calls:  # eager warm-up: lazy module loads, scheduler metadata
        fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            for fn in calls:
                fn()
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / len(calls))
    del graph
    return statistics.median(times)
