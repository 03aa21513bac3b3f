"""The rocm_smi source: librocm_smi64 in a supervised worker process, sysfs as its fallback.

source.py is the Source; supervisor.py owns the worker process and speaks protocol.py to it;
harness.py is the worker process less the library, worker.py its librocm_smi64 adapter (run with
`python -m exporter.sources.rocm_smi.worker`); library.py is the ctypes binding; convert.py turns
the library's values into the data model; mutex.py repairs the library's shared-memory mutexes a
dead process left locked.

Deliberately empty of imports: the worker process imports this package and must stay small.
"""
