"""Sources read devices and produce the data model (exporter.model).

base.py is the interface every source implements; identity.py is what both sources agree a device
is; sysfs/ reads the kernel ABI directly; rocm_smi/ reads through librocm_smi64 in a worker process;
gpu_metrics/ and textfiles.py are the pure parsers both use.
"""
