"""From demand to what the hardware reports: power, clocks, heat, counters — per package.

Integrated quantities (energy, lagged temperatures, traffic counters) are stepped on a fixed
time grid from t=0, so a reading is a deterministic function of (seed, elapsed) whatever the
sequence of ticks that led to it. Readings are quantised exactly as the driver writes them
(whole °C, whole W, MHz, 2^-16 J energy ticks), so the tree and the truth agree to the bit.
"""

from __future__ import annotations

import copy
import functools
import math
from dataclasses import dataclass, field

from exporter.simulator.asics import MI250X, AsicModel
from exporter.simulator.fleet import GcdLayout
from exporter.simulator.workload import Demand, Scenario, demand, hash_unit, smooth_noise

GRID_S = 0.25
LOW_UTILIZATION_PERCENT = 5.0  # a partition below this gfx busy counts as "low utilization"
TAU_JUNCTION_S = 7.0
TAU_EDGE_S = 12.0
TAU_MEMORY_S = 15.0
ENERGY_TICK_J = 2.0**-16  # 15.2587890625 uJ
THERMAL_THROTTLE_C = 90.0  # junction above which the SMU pulls gfxclk down in the simulation
BOOT_NS = 1_735_000_000_000  # boottime of the simulated host when t=0 (about 20 days)
FIRMWARE_TS0 = 173_400_000_000  # PMFW timestamp at t=0, 10 ns units
PCIE_MPS = 256
NUM_XGMI_LINKS = 8

# Faults (workload.FAULT_KINDS): how fast each count grows while its fault lasts
ECC_CE_PER_S = 5.0  # correctable errors per second (a storm: the correctable-rate check's case)
ECC_UE_EVERY_S = 2.0  # one uncorrectable (or deferred) error at the start, then one every this many seconds
AER_CORRECTABLE_PER_S = 3.0
AER_NONFATAL_EVERY_S = 2.0
AER_FATAL_EVERY_S = 5.0
CPER_EVERY_S = 5.0  # a CPER record at the start of a cper_* fault, then one every this many seconds
PENDING_S = 2.0  # a bad page found is pending this long before it is retired
DEVCOREDUMP_LIFETIME_S = 300.0  # the kernel drops an unread device coredump after 5 minutes
BAD_PAGE_COVER_BYTES = 100 * 1024 * 1024  # the driver's default threshold: one retired page per 100 MiB of VRAM
FIRST_BAD_PAGE = 0x000123AB

# ASIC-specific throttler bits (smu13_driver_if_aldebaran.h) and the ASIC-independent
# SMU_THROTTLER_* bits they map to (amdgpu_smu.h).
ALDEBARAN_THROTTLERS = {
    "ppt0": (0, 0),
    "ppt1": (1, 1),
    "tdc_gfx": (2, 16),
    "tdc_soc": (3, 17),
    "tdc_mem": (4, 18),
    "temp_gpu": (6, 32),
    "temp_mem": (7, 34),
    "temp_vr_gfx": (11, 38),
    "temp_vr_soc": (12, 39),
    "temp_vr_mem0": (13, 40),
    "apcc": (19, 23),
}


@dataclass(frozen=True, slots=True)
class DieReading:
    """Everything one GCD's files say at one instant, in the units the driver writes."""

    t: float
    gfx_busy: int  # %
    mem_busy: int  # %
    temps: dict[str, int]  # sensor -> °C
    power_w: int | None  # package power; None on an MI250X secondary die (which reads 0)
    energy_ticks: int | None  # 2^-16 J; None where the die reads 0
    sclk: int  # MHz
    sclk_deep_sleep: bool
    mclk: int
    fclk: int
    socclk: int
    vclk: int
    dclk: int
    vddgfx_mv: int | None
    throttlers: dict[str, bool]  # reason -> active (ASICs whose throttle bits are reported)
    throttle_status: int  # ASIC-specific bits
    indep_throttle_status: int
    vram_used: int
    gtt_used: int
    pcie_bw: tuple[int, int, int] | None  # (received msgs, posted requests sent, max payload)
    pcie_bw_inst_gbs: int | None
    pcie_bw_acc_gbs: int | None
    pcie_replays: int
    pcie_recoveries: int | None
    pcie_naks_sent: int | None
    pcie_naks_received: int | None
    xgmi_read_kb: tuple[int, ...] | None
    xgmi_write_kb: tuple[int, ...] | None
    xgmi_links_up: tuple[bool, ...] | None
    gfx_activity_acc: int
    mem_activity_acc: int
    ecc: dict[str, tuple[int, int]]  # block -> (uncorrectable, correctable)
    retired_pages: tuple[int, ...]  # page frame numbers
    system_clock_ns: int
    firmware_timestamp: int
    # MI300-class (gpu_metrics v1_6+): per compute partition, in partition order
    partition_gfx_busy: tuple[int, ...] = ()  # % (every XCC of a partition reports its partition's)
    partition_gfx_acc: tuple[int, ...] = ()  # accumulated %·s, like gfx_activity_acc
    partition_low_utilization_ticks: tuple[int, ...] = ()  # ms with the partition nearly idle
    # throttler residency accumulators, in accumulation_counter ticks (1 ms): name -> ticks
    residency_ticks: dict[str, int] = field(default_factory=dict)
    below_host_limit_ppt_ticks: int = 0  # ms with gfxclk held below the host limit by PPT
    below_host_limit_thm_ticks: int = 0  # ... by a thermal limit
    # faults (workload.FAULT_KINDS)
    ecc_deferred: dict[str, int] = field(default_factory=dict)  # block -> deferred count (the "de:" line)
    pending_pages: tuple[int, ...] = ()  # page frame numbers found bad, not yet retired
    cper_records: tuple[tuple[float, str], ...] = ()  # (elapsed s, "fatal"|"nonfatal"|"corrected"), oldest first
    reset_at: float | None = None  # elapsed s of the GPU reset whose device coredump is still there
    aer: dict[tuple[str, str], int] = field(default_factory=dict)  # (port, severity) -> AER errors since boot
    pcie_gts: float = 0.0  # the link as trained now (a pcie_downtrain fault: below its maximum)
    pcie_width: int = 0


@dataclass(slots=True)
class _DieState:
    junction: float
    edge: float
    memory: float
    gfx_acc: float  # %·s
    mem_acc: float
    pcie_gb_acc: float  # (GB/s)·s
    xgmi_read_kb: list[float] = field(default_factory=list)
    xgmi_write_kb: list[float] = field(default_factory=list)
    ppt_s: float = 0.0  # seconds spent power-limited (throttler residency)
    thermal_s: float = 0.0  # seconds spent thermally limited
    hbm_thermal_s: float = 0.0
    part_gfx_acc: list[float] = field(default_factory=list)  # per partition, %·s
    part_low_s: list[float] = field(default_factory=list)  # per partition, seconds nearly idle


@dataclass(slots=True)
class _State:
    t: float
    energy_j: float
    dies: list[_DieState]


@dataclass(frozen=True, slots=True)
class _Instant:
    demand: Demand
    partition_demands: tuple[Demand, ...]
    busy: bool
    sclk: float
    power_package: float
    ppt: bool
    thermal: bool
    junction_offset: float
    target_junction: float
    target_edge: float
    target_memory: float
    pcie_rate: float  # B/s
    xgmi_rate: float  # B/s per active link and direction


def _solve_power_weights(model: AsicModel) -> tuple[float, float, float]:
    """Weights (W per unit of gfx busy, mem busy, comm) so the two training phases draw the ASIC's
    nominal compute and communication power."""
    d_compute = model.power_compute - model.power_idle
    d_comm = model.power_comm - model.power_idle
    c = 0.1 * d_compute
    g1, m1, k1 = 0.975, 0.38, 0.04
    g2, m2, k2 = 0.30, 0.72, 1.0
    r1, r2 = d_compute - c * k1, d_comm - c * k2
    det = g1 * m2 - m1 * g2
    a = (r1 * m2 - m1 * r2) / det
    b = (g1 * r2 - g2 * r1) / det
    return a, b, c


class PackageModel:
    """One board: an MI210/MI300X (one die) or an MI250X (two dies sharing one power budget)."""

    def __init__(self, dies: list[GcdLayout], scenario: Scenario, seed: int, fleet_gcds: int) -> None:
        self.dies = dies
        self.model = dies[0].model
        self.scenario = scenario
        self.seed = seed
        self.fleet_gcds = fleet_gcds
        self.weights = _solve_power_weights(self.model)
        memory_limits = self.model.limits.get("memory")
        self._hbm_limit = float(memory_limits.critical) if memory_limits else math.inf
        n = len(dies)
        m = self.model
        # mean junction of steady training: the excursion is shaped around it
        mean_die_power = (0.72 * m.power_compute + 0.28 * m.power_comm) / n
        self.mean_junction = m.ambient + m.r_junction * mean_die_power
        self.ecc_gcd = int(hash_unit(seed, 11) * fleet_gcds)
        self.replay_gcd = int(hash_unit(seed, 12) * fleet_gcds)
        self.pcie_comm_rate = 6e9 if m.asic == "aldebaran" else 10e9  # Gen4 MI200 vs MI300-class
        self.xgmi_active_links = [min(NUM_XGMI_LINKS - 1, len(d.hive_members) - 1) for d in dies]
        # a sub-second workload needs a finer integration grid for energy and the accumulators
        self.grid = min(GRID_S, scenario.tick_interval / 2.0) if scenario.fast else GRID_S
        self._initial = self._initial_state()
        self._state = copy.deepcopy(self._initial)

    # ------------------------------------------------------------------ state
    def _initial_state(self) -> _State:
        probe = _State(0.0, 0.0, [_DieState(0.0, 0.0, 0.0, 0.0, 0.0, 0.0) for _ in self.dies])
        idle = self._instants(-1.0, probe)  # t<0 is idle in every scenario: steady idle heat
        dies = []
        for die, inst, links in zip(self.dies, idle, self.xgmi_active_links, strict=True):
            u = hash_unit(self.seed, 21, die.index)
            dies.append(
                _DieState(
                    junction=inst.target_junction,
                    edge=inst.target_edge,
                    memory=inst.target_memory,
                    gfx_acc=1e6 * (1 + u),
                    mem_acc=4e5 * (1 + u),
                    pcie_gb_acc=2e4 * (1 + u),
                    xgmi_read_kb=[3e7 * (1 + u) if k < links else 0.0 for k in range(NUM_XGMI_LINKS)],
                    xgmi_write_kb=[3e7 * (1 + u) if k < links else 0.0 for k in range(NUM_XGMI_LINKS)],
                    part_gfx_acc=[1e6 * (1 + u)] * len(die.partitions),
                    part_low_s=[0.0] * len(die.partitions),
                )
            )
        energy0 = 2.0e6 + 6.0e6 * hash_unit(self.seed, 22, self.dies[0].index)
        return _State(0.0, energy0, dies)

    def _advance_to(self, t: float) -> None:
        if t < self._state.t:
            self._state = copy.deepcopy(self._initial)
        while self._state.t + self.grid <= t + 1e-9:
            self._step(self._state, self.grid)

    def _step(self, state: _State, dt: float) -> None:
        instants = self._instants(state.t + dt / 2.0, state)
        kj, ke, km = (1.0 - math.exp(-dt / tau) for tau in (TAU_JUNCTION_S, TAU_EDGE_S, TAU_MEMORY_S))
        state.energy_j += instants[0].power_package * dt
        for i, (die, inst) in enumerate(zip(state.dies, instants, strict=True)):
            die.junction += (inst.target_junction - die.junction) * kj
            die.edge += (inst.target_edge - die.edge) * ke
            die.memory += (inst.target_memory - die.memory) * km
            die.gfx_acc += inst.demand.gfx * dt
            die.mem_acc += inst.demand.mem * dt
            if inst.ppt or self.scenario.fault_active("throttle", self.dies[i].index, state.t):
                die.ppt_s += dt
            if inst.thermal:
                die.thermal_s += dt
            if die.memory >= self._hbm_limit:
                die.hbm_thermal_s += dt
            for p, part in enumerate(inst.partition_demands):
                die.part_gfx_acc[p] += part.gfx * dt
                if part.gfx < LOW_UTILIZATION_PERCENT:
                    die.part_low_s[p] += dt
            die.pcie_gb_acc += inst.pcie_rate / 1e9 * dt
            kb = inst.xgmi_rate / 1024.0 * dt
            for link in range(self.xgmi_active_links[i]):
                if self.scenario.xgmi_down and self.scenario.xgmi_link_down(self.dies[i].index, link, state.t):
                    continue  # a link that is down carries nothing
                die.xgmi_read_kb[link] += kb
                die.xgmi_write_kb[link] += kb * 0.985
        state.t += dt

    def _excess_heat(self, gcd: int, t: float, junction: float) -> float:
        """°C the thermal excursion adds to a die's junction (0 outside it).

        At full strength the junction sits near the scenario's peak, keeping a trace of the
        training rhythm (compute phases a little hotter than communication), even if the
        excursion starts before the die has warmed up.
        """
        w = self.scenario.excursion_weight(gcd, t)
        if w <= 0.0:
            return 0.0
        rhythm = max(-1.5, min(1.5, junction - self.mean_junction))
        return w * (self.scenario.peak - 1.0 + rhythm - junction)

    # ---------------------------------------------------------------- instant
    def _instants(self, t: float, state: _State) -> list[_Instant]:
        m = self.model
        n = len(self.dies)
        a, b, c = (weight * self.scenario.load for weight in self.weights)  # x * 1.0 is x exactly
        partition_demands = [self._partition_demands(d, t) for d in self.dies]
        demands = [_average(parts) for parts in partition_demands]
        offsets = [self._excess_heat(d.index, t, st.junction) for d, st in zip(self.dies, state.dies, strict=True)]
        sclk_max = m.sclk_range[1]
        sclks, gfx_dyn, other_dyn, thermal = [], [], [], []
        for die, dem, st, off in zip(self.dies, demands, state.dies, offsets, strict=True):
            busy = dem.gfx >= 5.0
            hot = st.junction + off
            ratio = 1.0
            if busy and hot >= THERMAL_THROTTLE_C:
                ratio = max(0.6, 1.0 - 0.02 * (hot - THERMAL_THROTTLE_C + 1.0))
            thermal.append(busy and hot >= THERMAL_THROTTLE_C)
            sclk = sclk_max * ratio if busy else float(m.sclk_range[0])
            sclks.append(sclk)
            wobble = 1.0 + 0.015 * smooth_noise(self.seed, 4, die.index, t, 0.6)
            gfx_dyn.append(a * dem.gfx / 100.0 * (sclk / sclk_max) * wobble / n)
            other_dyn.append((b * dem.mem / 100.0 + c * dem.comm) * wobble / n)
        package = m.power_idle + sum(gfx_dyn) + sum(other_dyn)
        ppt = package > m.power_cap
        if ppt:
            # the SMU holds the package at its power limit by pulling gfxclk down
            room = m.power_cap - 0.4 - m.power_idle - sum(other_dyn)
            scale = max(0.5, room / sum(gfx_dyn))
            gfx_dyn = [g * scale for g in gfx_dyn]
            sclks = [s * scale if dem.gfx >= 5.0 else s for s, dem in zip(sclks, demands, strict=True)]
            package = m.power_idle + sum(gfx_dyn) + sum(other_dyn)
        result = []
        for i, die in enumerate(self.dies):
            dem = demands[i]
            p_die = m.power_idle / n + gfx_dyn[i] + other_dyn[i]
            pcie = 2e6
            xgmi = 0.0
            if self.scenario.trains and t >= 0:
                pn = 1.0 + 0.1 * smooth_noise(self.seed, 5, die.index, t, 0.8)
                pcie = (0.25e9 + dem.comm * self.pcie_comm_rate) * pn
                xgmi = (0.15e9 + dem.comm * 40e9) * pn
            result.append(
                _Instant(
                    demand=dem,
                    partition_demands=partition_demands[i],
                    busy=dem.gfx >= 5.0,
                    sclk=sclks[i],
                    power_package=package,
                    ppt=ppt,
                    thermal=thermal[i],
                    junction_offset=offsets[i],
                    target_junction=m.ambient + m.r_junction * p_die,
                    target_edge=m.ambient + m.r_edge * p_die,
                    target_memory=m.ambient + 3.0 + m.r_memory * p_die + 6.0 * dem.mem / 100.0,
                    pcie_rate=pcie,
                    xgmi_rate=xgmi,
                )
            )
        return result

    def _partition_demands(self, die: GcdLayout, t: float) -> tuple[Demand, ...]:
        """What each compute partition of a die runs. Partition 0 keeps the die's own workload key,
        so an unpartitioned die (SPX, MI200) is asked exactly what it always was."""
        count = len(die.partitions)
        keys = [die.index] + [100_000 + 8 * die.index + p for p in range(1, count)]
        return tuple(demand(self.scenario, self.seed, key, t) for key in keys)

    # ---------------------------------------------------------------- reading
    def readings(self, t: float) -> list[DieReading]:
        """What each die of this package reports at elapsed time t (seconds since write_tree)."""
        t = max(0.0, t)
        self._advance_to(t)
        state = self._state
        if t > state.t + 1e-9:
            state = copy.deepcopy(state)
            self._step(state, t - state.t)
        instants = self._instants(t, state)
        return [self._reading(i, t, state, inst) for i, inst in enumerate(instants)]

    def _reading(self, i: int, t: float, state: _State, inst: _Instant) -> DieReading:
        m = self.model
        die = self.dies[i]
        st = state.dies[i]
        off = inst.junction_offset
        seed, g = self.seed, die.index

        def noisy(value: float, stream: int) -> int:
            return round(value + 0.45 * smooth_noise(seed, stream, g, t, 2.3))

        swing = self.scenario.hotspot_swing(seed, g, t)
        junction = noisy(st.junction + off + swing, 30)
        edge = noisy(st.edge + 0.6 * off, 31)
        memory = noisy(st.memory + 0.4 * off + 0.3 * swing, 32)
        temps = {"edge": edge} if m.has_edge_sensor else {}
        temps.update(junction=junction, memory=memory)
        amb = m.ambient
        v1_3 = die.metrics_version == (1, 3)
        if v1_3:
            for k, spread in enumerate((-1.6, -0.4, 0.7, 1.5)):
                temps[f"hbm{k}"] = noisy(st.memory + 0.4 * off + spread, 33 + k)
            temps["vr_gfx"] = noisy(amb + 6.0 + 0.55 * (st.edge - amb), 37)
            temps["vr_soc"] = noisy(amb + 4.0 + 0.35 * (st.edge - amb), 38)
            temps["vr_mem"] = noisy(amb + 3.0 + 0.45 * (st.memory - amb), 39)
        else:
            temps["vr_soc"] = noisy(amb + 5.0 + 0.5 * (st.edge - amb), 38)

        primary = die.die == 0
        power_w = round(inst.power_package) if primary else None
        energy = int(state.energy_j / ENERGY_TICK_J) if primary else None

        dem = inst.demand
        busy = inst.busy
        deep_sleep = (not busy) and m.sclk_deep_sleep is not None
        sclk = m.sclk_deep_sleep if deep_sleep and m.sclk_deep_sleep else round(inst.sclk)
        active = busy or dem.mem >= 5.0
        mclk = m.mclk_levels[-1] if active else m.mclk_levels[0]
        fclk = m.fclk_levels[-1] if active else m.fclk_levels[0]
        socclk = m.socclk_levels[-1] if active else m.socclk_levels[0]
        vddgfx = round(700 + (max(sclk, m.sclk_range[0]) - 500) * 0.2) if m.has_vddgfx else None

        throttlers: dict[str, bool] = {}
        status = indep = 0
        if v1_3:
            held = self.scenario.fault_active("throttle", g, t)
            active_reasons = {"ppt0": inst.ppt or held, "temp_gpu": inst.thermal}
            for reason, (bit, indep_bit) in ALDEBARAN_THROTTLERS.items():
                on = active_reasons.get(reason, False)
                throttlers[reason] = on
                if on:
                    status |= 1 << bit
                    indep |= 1 << indep_bit

        vram_base = 11_198_464 if m is not MI250X else 11_177_984
        vram_used = vram_base
        gtt_used = 11_431_936
        if dem.load > 0:
            churn = 2 * 1024 * 1024 * round(8 * smooth_noise(seed, 40, g, t, 3.1))
            vram_used += int(dem.load * 0.81 * m.vram_bytes) + churn
            gtt_used += int(dem.load * 1_610_612_736)
        vram_used = max(vram_base, min(vram_used, m.vram_bytes - 64 * 1024 * 1024))

        pcie_bw = None
        if m.pcie_bw_file:
            msgs = inst.pcie_rate / PCIE_MPS
            pcie_bw = (round(msgs * 0.6), round(msgs * 0.4), PCIE_MPS)

        trains = self.scenario.trains
        replays = 0
        if g == self.replay_gcd:
            replays = 5 + (int(t // 90) if trains else 0)
        inst_gbs = acc_gbs = recoveries = naks_sent = naks_received = None
        xgmi_read = xgmi_write = links_up = None
        if not v1_3:
            inst_gbs = round(inst.pcie_rate / 1e9)
            acc_gbs = int(st.pcie_gb_acc)
            recoveries = 2 * replays + (1 if g == self.replay_gcd else 0)
            naks_sent = replays
            naks_received = replays // 2
            xgmi_read = tuple(int(v) for v in st.xgmi_read_kb)
            xgmi_write = tuple(int(v) for v in st.xgmi_write_kb)
            links_up = tuple(
                k < self.xgmi_active_links[i] and not self.scenario.xgmi_link_down(g, k, t)
                for k in range(NUM_XGMI_LINKS)
            )

        ecc = {block: (0, 0) for block in m.ras_blocks}
        retired: tuple[int, ...] = ()
        if g == self.ecc_gcd:
            ecc["umc"] = (0, 2 + (int((t + 37.0) // 240) if trains else 0))
            retired = (FIRST_BAD_PAGE,)
        faults = _FaultReading.at(self.scenario, die, t)
        if faults.ecc_ue or faults.ecc_ce:
            ue, ce = ecc.get("umc", (0, 0))
            ecc["umc"] = (ue + faults.ecc_ue, ce + faults.ecc_ce)
        if "xgmi_wafl" in ecc and self.scenario.fault_active("xgmi_down", g, t):
            ecc["xgmi_wafl"] = (0, 1)  # the link's training errors, read while it is down
        if faults.retired:  # the driver stops retiring at its threshold
            retired = tuple(sorted({*retired, *faults.retired}))[: bad_page_threshold(m)]
        downtrained = self.scenario.fault_active("pcie_downtrain", g, t)

        return DieReading(
            t=t,
            gfx_busy=max(0, min(100, round(dem.gfx))),
            mem_busy=max(0, min(100, round(dem.mem))),
            temps=temps,
            power_w=power_w,
            energy_ticks=energy,
            sclk=sclk,
            sclk_deep_sleep=deep_sleep,
            mclk=mclk,
            fclk=fclk,
            socclk=socclk,
            vclk=m.vclk_levels[0],
            dclk=m.dclk_levels[0],
            vddgfx_mv=vddgfx,
            throttlers=throttlers,
            throttle_status=status,
            indep_throttle_status=indep,
            vram_used=vram_used,
            gtt_used=gtt_used,
            pcie_bw=pcie_bw,
            pcie_bw_inst_gbs=inst_gbs,
            pcie_bw_acc_gbs=acc_gbs,
            pcie_replays=replays,
            pcie_recoveries=recoveries,
            pcie_naks_sent=naks_sent,
            pcie_naks_received=naks_received,
            xgmi_read_kb=xgmi_read,
            xgmi_write_kb=xgmi_write,
            xgmi_links_up=links_up,
            gfx_activity_acc=int(st.gfx_acc) & 0xFFFFFFFF,
            mem_activity_acc=int(st.mem_acc) & 0xFFFFFFFF,
            ecc=ecc,
            retired_pages=retired,
            system_clock_ns=BOOT_NS + round(t * 1e9),
            firmware_timestamp=FIRMWARE_TS0 + round(t * 1e8),
            partition_gfx_busy=tuple(max(0, min(100, round(d.gfx))) for d in inst.partition_demands),
            partition_gfx_acc=tuple(int(a) for a in st.part_gfx_acc),
            partition_low_utilization_ticks=tuple(_ticks(s) for s in st.part_low_s),
            residency_ticks={
                "prochot": 0,
                "ppt": _ticks(st.ppt_s),
                "socket_thm": _ticks(st.thermal_s),
                "vr_thm": 0,
                "hbm_thm": _ticks(st.hbm_thermal_s),
            },
            below_host_limit_ppt_ticks=_ticks(st.ppt_s),
            below_host_limit_thm_ticks=_ticks(st.thermal_s),
            ecc_deferred={"umc": faults.ecc_de} if self.scenario.has_fault("ecc_de", g) else {},
            pending_pages=faults.pending,
            cper_records=faults.cper if m.compute_partitions else (),  # the CPER ring: MI300-class only
            reset_at=faults.reset_at,
            aer=faults.aer,
            pcie_gts=m.pcie_gts / 2 if downtrained else m.pcie_gts,
            pcie_width=m.pcie_width // 2 if downtrained else m.pcie_width,
        )


def bad_page_threshold(model: AsicModel) -> int:
    """The retired-page count the driver stops at by default (bad_page_threshold=-1 or -2): one page per
    100 MiB of the device's VRAM (its EEPROM table holds ~10900 records, far more for any Instinct)."""
    return model.vram_bytes // BAD_PAGE_COVER_BYTES


def _every(seconds: float | None, period: float) -> int:
    """Events of a fault that writes one at its start and one every `period` seconds (0 before it starts)."""
    return 0 if seconds is None else 1 + int(seconds // period)


@dataclass(frozen=True, slots=True)
class _FaultReading:
    """What a GCD's injected faults add to its files at one instant (all 0 / empty without faults)."""

    ecc_ce: int = 0
    ecc_ue: int = 0
    ecc_de: int = 0
    retired: tuple[int, ...] = ()
    pending: tuple[int, ...] = ()
    cper: tuple[tuple[float, str], ...] = ()
    reset_at: float | None = None
    aer: dict[tuple[str, str], int] = field(default_factory=dict)

    @classmethod
    def at(cls, scenario: Scenario, die: GcdLayout, t: float) -> _FaultReading:
        g = die.index
        if not any(gcd == g for _kind, gcd in scenario.faults):
            return _NO_FAULTS
        lasted = functools.partial(scenario.fault_seconds, gcd=g, t=t)
        ce = lasted("ecc_ce")
        retired, pending = _bad_pages(scenario, die.model, lasted("bad_pages"))
        cper: list[tuple[float, str]] = []
        for severity in ("fatal", "nonfatal", "corrected"):
            count = _every(lasted(f"cper_{severity}"), CPER_EVERY_S)
            cper += [(scenario.fault_at + k * CPER_EVERY_S, severity) for k in range(count)]
        cper.sort()
        reset = lasted("reset")
        dump_kept = min(scenario.fault_for, DEVCOREDUMP_LIFETIME_S)
        aer_c, aer_n, aer_f = (lasted(f"aer_{kind}") for kind in ("correctable", "nonfatal", "fatal"))
        aer = {
            ("device", "correctable"): int(AER_CORRECTABLE_PER_S * aer_c) if aer_c is not None else 0,
            ("device", "nonfatal"): _every(aer_n, AER_NONFATAL_EVERY_S),
            ("device", "fatal"): _every(aer_f, AER_FATAL_EVERY_S),
            ("upstream", "fatal"): _every(aer_f, AER_FATAL_EVERY_S),  # the port sees the link go down with it
        }
        return cls(
            ecc_ce=int(ECC_CE_PER_S * ce) if ce is not None else 0,
            ecc_ue=_every(lasted("ecc_ue"), ECC_UE_EVERY_S),
            ecc_de=_every(lasted("ecc_de"), ECC_UE_EVERY_S),
            retired=retired,
            pending=pending,
            cper=tuple(cper),
            reset_at=scenario.fault_at if reset is not None and t < scenario.fault_at + dump_kept else None,
            aer={key: count for key, count in aer.items() if count},
        )


_NO_FAULTS = _FaultReading()


def _bad_pages(scenario: Scenario, model: AsicModel, lasted: float | None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(retired, pending) page frames of a bad_pages fault `lasted` seconds in: pages are found at a steady
    rate, each pending PENDING_S before it is retired, so that the retired count reaches the driver's
    threshold as the fault ends; retired pages stay retired (the board's VRAM does not heal)."""
    if lasted is None:
        return (), ()
    threshold = bad_page_threshold(model)
    lag = min(PENDING_S, scenario.fault_for / 2)
    span = scenario.fault_for - lag

    def found(seconds: float) -> int:
        return 0 if seconds < 0 else min(threshold, math.ceil(threshold * min(seconds, span) / span) or 1)

    retired_count = found(lasted - lag) if lasted < scenario.fault_for else threshold
    pages = [FIRST_BAD_PAGE + 0x1000 + 0x37 * k for k in range(found(lasted))]
    return tuple(pages[:retired_count]), tuple(pages[retired_count:])


def _ticks(seconds: float) -> int:
    """Seconds as the firmware's 1 ms accumulation ticks (u32 counters wrap)."""
    return round(seconds * 1000) & 0xFFFFFFFF


def _average(demands: tuple[Demand, ...]) -> Demand:
    """The socket-wide demand of its partitions (one partition: itself, unchanged)."""
    if len(demands) == 1:
        return demands[0]
    n = len(demands)
    return Demand(
        sum(d.gfx for d in demands) / n,
        sum(d.mem for d in demands) / n,
        sum(d.comm for d in demands) / n,
        max(d.load for d in demands),
    )
