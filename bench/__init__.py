"""Side-by-side benchmarks of amdgpu-exporter against its peers on one simulated node.

`python -m bench` (what `make bench` runs) measures, in one run on the same simulated tree, this
exporter, Debian's prometheus-node-exporter (drm + hwmon collectors), the rocm-smi CLI and a bare
ASGI app on the same uvicorn (the ceiling), prints a table of absolute figures and ratios, and
writes it to bench/RESULTS.md with the machine and date.
"""
