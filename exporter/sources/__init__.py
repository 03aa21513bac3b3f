"""Sources read devices and produce the data model (exporter.model)."""
