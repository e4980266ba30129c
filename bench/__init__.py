"""radixrt benchmarks: workload generators, the serving load generator, HF peer baselines, rooflines."""
