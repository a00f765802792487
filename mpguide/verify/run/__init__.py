"""How an example runs: the runner, its probes, DDP and Fabric runs, the throughput benchmark."""
