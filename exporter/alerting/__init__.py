"""In-daemon alerting: rule files, the per-cycle state machine, texts for people, and the Alertmanager push."""
