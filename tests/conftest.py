"""Settings for every test session."""

from __future__ import annotations

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


# --- integration and oracle tests on several workers (`make test`: pytest-xdist, --dist loadgroup) ----
#
# Each module's tests run on one worker, in order, so a module-scoped daemon or stack is started once
# (as `--dist loadfile` would). The modules below share a group instead: a group's modules run one
# after the other on one worker, so no two of them ever overlap each other.
# - "stacks": real Prometheus / Alertmanager / VictoriaMetrics stacks and chromium, whose waits are on
#   pages and rule evaluations of 1 s stacks, and the bench-like tests that compare latencies or hold
#   thousands of connections: they get the same share of the machine as when they ran alone with
#   the rest of the suite.
# - "builds": the OCI image, the .deb, the venvs installed from the wheel, the systemd install and the
#   coverage-guided fuzzer: CPU-bound work that would starve the stacks if it ran beside them twice.
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
_OWN_GROUP = ("tests/integration/", "tests/oracles/", "tests/fuzz/")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker reads the marks (--dist loadgroup)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = config.rootpath
    for item in items:
        module = item.path.relative_to(root).as_posix()
        if module.startswith(_OWN_GROUP):
            item.add_marker(pytest.mark.xdist_group(_GROUP_OF.get(module, module)))
    # The long groups first: a worker that takes one at the end would run alone for minutes.
    first = {group: rank for rank, group in enumerate(SERIAL_GROUPS)}
    items.sort(key=lambda item: first.get(_GROUP_OF.get(item.path.relative_to(root).as_posix(), ""), len(first)))
