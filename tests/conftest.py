"""Settings for every test session."""

from __future__ import annotations

import signal

# A suite started as a background job of a shell without job control inherits SIGINT ignored, and
# every process a test starts would inherit that too: Ctrl-C tests of `snapshot --watch` and the demo
# stack would then wait in vain. Handled here, children start with SIGINT at its default again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
