"""python -m exporter.simulator --path.sysfs DIR [--fleet SPEC] [--scenario NAME] [--interval S]
[--truth-file F] [--seed N] [--once]

Writes a simulated amdgpu sysfs tree under DIR (DIR stands for /sys) and keeps it ticking until
SIGTERM/SIGINT. Bad input gets one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from exporter.simulator.asics import ASICS
from exporter.simulator.fleet import options_help, parse_fleet
from exporter.simulator.simulator import Simulator
from exporter.simulator.workload import parse_scenario, scenario_help

# --help's account of the fleet syntax; config.py's --demo.fleet says the same (a unit test holds both).
_MODELS_BY_OPTIONS: dict[str, list[str]] = {}
for _model in ASICS.values():
    _MODELS_BY_OPTIONS.setdefault(options_help(_model), []).append(_model.name)
FLEET_HELP = (
    "[N x]MODEL[:OPTION...] terms, comma-separated, e.g. 4xMI250X, 1xMI210,2xMI250X, 2xMI300X:CPX:NPS4,"
    " MI300X:gpu_metrics=1.5. Options: "
    + "; ".join(f"{'/'.join(names)}: {options}" for options, names in _MODELS_BY_OPTIONS.items())
)


def build_parser(prog: str = "python -m exporter.simulator") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Write a simulated amdgpu sysfs tree (MI210, MI250X, MI300X, MI325X, MI350X, MI355X) and keep it"
        " updated.",
    )
    parser.add_argument("--path.sysfs", dest="sysfs", required=True, type=Path, help="directory standing for /sys")
    parser.add_argument("--fleet", default="4xMI250X", help=FLEET_HELP + " (default 4xMI250X)")
    parser.add_argument(
        "--scenario",
        default="idle",
        help=f"the workload and its options: {scenario_help()} (default idle)",
    )
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between updates (default 1)")
    parser.add_argument("--truth-file", type=Path, help="rewrite the simulator's truth as JSON here every tick")
    parser.add_argument("--once", action="store_true", help="write the tree for t=0 and exit")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "python -m exporter.simulator") -> int:
    """Run the simulator CLI; returns the exit status (2 for bad input)."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    try:
        fleet = parse_fleet(args.fleet)
        scenario = parse_scenario(args.scenario)
    except ValueError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    if not args.interval > 0:
        print(f"{parser.prog}: error: --interval must be a positive number of seconds", file=sys.stderr)
        return 2
    try:
        simulator = Simulator(args.sysfs, fleet, str(scenario), seed=args.seed)
        if args.once:
            simulator.write_tree()
            if args.truth_file:
                simulator.write_truth_json(args.truth_file)
            return 0
        stop = threading.Event()

        def request_stop(signum: int, frame: object) -> None:
            stop.set()

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
        simulator.run(args.interval, stop, truth_file=args.truth_file)
    except OSError as exc:
        print(f"{parser.prog}: error: cannot write the tree: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
