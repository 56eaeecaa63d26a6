"""CuTe DSL building blocks, written once and imported by the generated kernel modules at build
time (codegen.identity.cute_blocks_hash puts their sources into every artifact key)."""
