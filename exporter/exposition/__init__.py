"""Exposition: the one table of every metric the exporter serves (metrics.py), and its rendering to /metrics."""
