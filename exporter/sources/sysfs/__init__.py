"""The sysfs source: discovery.py finds devices, table.py declares which file fills which Sample field,
slow.py reads the rarely-changing values, source.py assembles one Sample per read."""

from exporter.sources.sysfs.source import SysfsSource

__all__ = ["SysfsSource"]
