"""Running on several processes: data parallelism (collectives over ranks), sharded models (FSDP2), the vLLM sampling engine, and the watch that ends workers with their launcher."""
