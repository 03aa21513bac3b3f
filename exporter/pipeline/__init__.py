"""Polling: discovery keeps the set of known devices, the poller reads them every cycle into an immutable
Snapshot, enrich adds what is derived from a whole snapshot (attribution labels will go there)."""
