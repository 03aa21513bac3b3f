"""The amd-smi source: AMD's `amdsmi` Python module (libamd_smi) in a supervised worker process.

worker.py runs in the worker process (started by the rocm_smi Supervisor, same protocol);
convert.py turns its answers into the data model; source.py is the Source (the rocm_smi source's
machinery: supervision, hang handling, the sysfs fallback underneath).

Deliberately empty of imports: the worker process imports this package and must stay small.
"""
