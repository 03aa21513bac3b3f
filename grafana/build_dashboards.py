"""Write the Grafana dashboards in grafana/dashboards/ from their declarations in grafana/builder/.

    python grafana/build_dashboards.py           # rewrite the JSON files
    python grafana/build_dashboards.py --check   # exit 1 if the committed JSON is out of date

Temperature, stale-age and power-cap levels are read from exporter/alerting/default_rules.yaml and
deploy/prometheus/amdgpu-exporter.rules.yml: change a rule there, run this, commit both.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make `grafana.builder` importable
    sys.path.insert(0, str(ROOT))

from grafana.builder import dashboards, memory_limits, to_text  # noqa: E402
from grafana.builder.thresholds import DAEMON_RULES, PROMETHEUS_RULES, RulesError, load  # noqa: E402

DASHBOARD_DIR = ROOT / "grafana" / "dashboards"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="fail if the committed JSON differs")
    parser.add_argument("--out", type=Path, default=DASHBOARD_DIR, help="directory to write (default: %(default)s)")
    parser.add_argument(
        "--daemon-rules", type=Path, default=DAEMON_RULES, help="in-daemon rules (default: %(default)s)"
    )
    parser.add_argument(
        "--prometheus-rules", type=Path, default=PROMETHEUS_RULES, help="Prometheus rules (default: %(default)s)"
    )
    parser.add_argument(
        "--systemd-unit",
        type=Path,
        default=memory_limits.SYSTEMD_UNIT,
        help="systemd unit whose MemoryMax the dashboards draw (default: %(default)s)",
    )
    parser.add_argument(
        "--daemonset",
        type=Path,
        default=memory_limits.DAEMONSET,
        help="DaemonSet whose container memory limit the dashboards draw (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    try:
        generated = dashboards(
            load(args.daemon_rules, args.prometheus_rules), memory_limits.load(args.systemd_unit, args.daemonset)
        )
    except (RulesError, memory_limits.LimitsError) as error:
        print(f"build_dashboards: {error}", file=sys.stderr)
        return 2
    stale = []
    for name, dashboard in generated.items():
        path = args.out / name
        text = to_text(dashboard)
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(str(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    if stale:
        print("out of date, run python grafana/build_dashboards.py:", *stale, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
