"""Context parallelism: the sequence split over the cp ranks, and attention Cells that see all of it.

- `layout`: which tokens a cp rank holds (2 x cp chunks, rank r holding chunks r and 2cp-1-r) and
  the numpy slicing of a batch's columns for that rank; numpy only, importable without MindSpore.
- `blocks`: the blockwise attention maths (online softmax over key blocks, its backward).
- `exchange`: the ring shift (every rank sends to the next and receives from the previous).
- `ring`: `RingAttention` (context_parallel_method colossal).
- `ulysses`: `UlyssesAttention` (ulysses) and `HybridAttention` (hybrid: Ulysses inside the ring).
- `methods`: `ContextParallelSettings` (the YAML fields, checked), the model-shape checks, and
  `context_parallel_attention`, the factory a model plan calls.

Nothing here is imported by `mf_parallel/__init__` eagerly except `layout` (it needs no MindSpore).
"""
