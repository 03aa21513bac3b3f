"""The binary gpu_metrics table: layouts.py declares every kernel struct version, decoder.py decodes."""

from exporter.sources.gpu_metrics.decoder import (
    GpuMetrics,
    GpuMetricsError,
    decode_gpu_metrics,
    decode_partition_metrics,
)

__all__ = ["GpuMetrics", "GpuMetricsError", "decode_gpu_metrics", "decode_partition_metrics"]
