"""A simulated amdgpu sysfs tree for a chosen fleet and workload, faithful enough that the real
librocm_smi64, rocm-smi and node_exporter read it.

    sim = Simulator(Path("/tmp/sys"), "1xMI210,2xMI250X", "training", seed=1)
    sim.write_tree(); sim.tick(12.5); sim.truth()

MI300-class sockets take compute/memory partition modes ("2xMI300X:CPX:NPS4"): one truth device
per partition, laid out as the driver does (see fleet.py). The "alternating" scenario changes
values within a second and keeps sliding-window truth (Simulator.windows()).
"""

from exporter.simulator.fleet import parse_fleet
from exporter.simulator.simulator import Simulator
from exporter.simulator.truth import SimulatedDevice, load_truth_json
from exporter.simulator.workload import SCENARIOS, parse_scenario

__all__ = ["SCENARIOS", "SimulatedDevice", "Simulator", "load_truth_json", "parse_fleet", "parse_scenario"]
