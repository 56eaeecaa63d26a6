"""Sparse MLA building blocks: online softmax (softmax), accumulator-fragment views (fragments),
the split-partials combine kernel (combine) and the fake arguments for compiling (fakes)."""
