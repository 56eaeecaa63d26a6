"""Third-party kernels that b12x benchmarks against (thin wrappers, no vendored code)."""
