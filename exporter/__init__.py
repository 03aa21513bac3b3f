"""amdgpu-exporter: a Prometheus exporter for AMD Instinct GPUs (MI210, MI250X, MI300X)."""

__version__ = "0.1.0"
