"""The amd-smi source: AMD's `amdsmi` Python module (libamd_smi) in a supervised worker process.

worker.py is the adapter the worker harness (rocm_smi/harness.py) runs for the amdsmi module;
convert.py turns its answers into the data model; source.py is the Source (the rocm_smi source's
machinery: supervision, hang handling, the sysfs fallback underneath).

Deliberately empty of imports: the worker process imports this package and must stay small.
"""
