"""What a model costs to run: FLOPs here; latency and throughput join with the latency benchmark."""
