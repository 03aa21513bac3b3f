"""What each job or pod used of its devices: energy, GPU time, peaks, errors (docs/accounting.md)."""
