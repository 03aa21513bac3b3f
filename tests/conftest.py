"""Settings for every test session."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from tests import harness
from tests.harness import Daemon

# A suite started as a background job of a shell without job control inherits SIGINT ignored, and
# every process a test starts would inherit that too: Ctrl-C tests of `snapshot --watch` and the demo
# stack would then wait in vain. Handled here, children start with SIGINT at its default again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# No property test is timed (tests/unit, tests/fuzz): hypothesis's default 200 ms deadline per example
# (and its too-slow health check) fail on a loaded machine what passes on an idle one. A test's own
# @settings still rules.
settings.register_profile("untimed", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("untimed")


@pytest.fixture
def start_daemon(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    """Starts `amdgpu-exporter` (tests.harness.start_daemon: args, ready=True, ...) as often as the
    test asks, each with its log in its own folder under tmp_path; stops every one at the end."""
    started: list[Daemon] = []

    def start(*args: str, **kwargs: Any) -> Daemon:
        daemon = harness.start_daemon(tmp_path / f"daemon-{len(started)}", *args, **kwargs)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        harness.stop(daemon.process)


# --- integration, oracle and fuzz tests on several workers -------------------------------------------
#
# `make integration INTEGRATION_WORKERS=3` (pytest-xdist, --dist loadfile; the default is one process):
# each module's tests run on one worker, in order, so a module-scoped daemon or stack starts once.
# The modules below share a group instead: a group runs on one worker, one module after the other,
# so no two of its modules ever overlap.
# - "stacks": real Prometheus / Alertmanager / VictoriaMetrics stacks and chromium, whose waits are on
#   pages and rule evaluations of 1 s stacks, and the bench-like tests that compare latencies or hold
#   thousands of connections.
# - "builds": the OCI image, the .deb, the venvs installed from the wheel, the systemd install and the
#   coverage-guided fuzzer: CPU-bound work, one at a time.
# (pytest-xdist's own `--dist loadgroup` reads xdist_group marks, but sets a node id field that
# pytest 9 no longer reads: every test would go its own way.)
SERIAL_GROUPS = {
    "stacks": (
        "tests/integration/test_alerting_e2e.py",
        "tests/integration/test_alertmanager_push.py",
        "tests/integration/test_dme_compat.py",
        "tests/integration/test_fleet_two_tier.py",
        "tests/integration/test_grafana_dashboards.py",
        "tests/integration/test_health_alerts_e2e.py",
        "tests/integration/test_hostile_edges.py",
        "tests/integration/test_job_accounting_e2e.py",
        "tests/integration/test_job_report_prometheus.py",
        "tests/integration/test_node_life.py",
        "tests/integration/test_prometheus_rules.py",
        "tests/integration/test_status_page_browser.py",
        "tests/integration/test_swing_alert_e2e.py",
        "tests/integration/test_web_security.py",
        "tests/integration/test_windows_e2e.py",
    ),
    "builds": (
        "tests/fuzz/test_fuzz_parsers.py",
        "tests/integration/test_deb_maintainer_scripts.py",
        "tests/integration/test_deb_package.py",
        "tests/integration/test_dockerfile.py",
        "tests/integration/test_least_privilege.py",
        "tests/integration/test_oci_image.py",
        "tests/integration/test_systemd_debugfs_dropin.py",
        "tests/integration/test_systemd_unit.py",
        "tests/integration/test_wheel.py",
    ),
}
_GROUP_OF = {module: group for group, modules in SERIAL_GROUPS.items() for module in modules}


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """--dist loadfile, with the modules of a group as one file."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class GroupScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = super()._split_scope(nodeid)
            return _GROUP_OF.get(module, module)

    return GroupScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On workers, the groups first, in the order above: a worker that took one last would run alone
    for minutes. One process keeps the collection order."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    first = {group: rank for rank, group in enumerate(SERIAL_GROUPS)}
    root = config.rootpath
    items.sort(key=lambda item: first.get(_GROUP_OF.get(item.path.relative_to(root).as_posix(), ""), len(first)))
