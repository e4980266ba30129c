"""Tensor parallelism (Megatron-style, docs/tensor_parallel.md): the rank group, the sharded
layers and the shard layout of a checkpoint."""
