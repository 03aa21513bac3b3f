"""The kernel's binary struct layouts (gpu_metrics, partition metrics, board sensors): data that
both the sources (to decode) and the simulator (to write) read; it imports nothing of the exporter."""
