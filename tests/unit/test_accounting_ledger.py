"""exporter/accounting: the ledger's cycle-by-cycle charges, the package split, the state file."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.accounting.ledger import Ledger, Limits, account
from exporter.accounting.split import split_ratios
from exporter.accounting.store import LedgerStore, ledger_from_json, ledger_json
from exporter.model import (
    Allocation,
    Attribution,
    DeviceIdentity,
    DeviceState,
    GpuHealth,
    HealthCheck,
    HealthVerdict,
    Sample,
    Snapshot,
    frozen_map,
)

# An MI250X: gpu 0 (die 0, the package's counter) and gpu 1 (die 1, no energy of its own)
DIES = (
    DeviceIdentity("0000:01:00.0", "card0", "/d0", unique_id="a", package="P", die=0, product="MI250X"),
    DeviceIdentity("0000:03:00.0", "card1", "/d1", unique_id="b", package="P", die=1, product="MI250X"),
)


def snapshot(
    t: float, energy: float, busy: tuple[float, float], jobs: dict[str, tuple[int, ...]], **extra: object
) -> Snapshot:
    devices = tuple(
        DeviceState(
            identity,
            gpu,
            Sample(
                timestamp=t,
                energy_joules=energy if gpu == 0 else None,
                busy=frozen_map({"gfx": busy[gpu], "memory": 0.5}),
                temperatures=frozen_map({"junction": 60.0 + gpu + t / 100, "memory": 50.0}),
                memory_used_bytes=frozen_map({"vram": 1e9 * (1 + t / 10)}),
                ecc_errors=frozen_map({("umc", "correctable"): int(extra.get("ecc", 0))}),
                throttle=frozen_map({"ppt0": bool(extra.get("throttled"))}),
            ),
            up=True,
        )
        for gpu, identity in enumerate(DIES)
    )
    allocations = tuple(
        Allocation(gpu, "slurm", str(gpu), "slurm", (("job_id", job), ("job_user", "u")))
        for job, gpus in jobs.items()
        for gpu in gpus
    )
    attribution = Attribution(
        ("job_id", "job_user"), allocations=allocations, sources_up=frozen_map({"slurm": extra.get("up", True)})
    )
    return Snapshot(taken_at=t, devices=devices, attribution=attribution)


def run(steps: list[Snapshot], ledger: Ledger | None = None, health: HealthVerdict | None = None) -> Ledger:
    ledger = ledger or Ledger()
    for step in steps:
        ledger, _ended = account(ledger, step, health)
    return ledger


def test_two_jobs_on_two_dies_share_the_package_counter_by_busy_and_sum_to_it() -> None:
    jobs = {"1": (0,), "2": (1,)}
    ledger = run(
        [
            snapshot(100.0, 1000.0, (0.5, 0.5), jobs),
            snapshot(101.0, 1300.0, (0.75, 0.25), jobs),  # 300 J: 225 / 75
            snapshot(102.0, 1500.0, (0.0, 0.0), jobs),  # idle: equal, 100 / 100
            snapshot(103.0, 1600.0, (1.0, 0.0), {}),  # both end: 100 J to job 1
        ]
    )
    one, two = (ledger.find(j) for j in ("1", "2"))
    assert one is not None and two is not None
    assert one.ended_at == two.ended_at == 103.0 and not ledger.running
    assert one.energy_joules == pytest.approx(225 + 100 + 100)
    assert two.energy_joules == pytest.approx(75 + 100)
    assert one.energy_joules + two.energy_joules == pytest.approx(1600 - 1000)
    assert one.devices[0].package_energy_joules == pytest.approx(600)
    assert one.gpu_seconds == 3.0 and one.devices[0].busy_seconds["gfx"] == pytest.approx(1.75)
    assert one.devices[0].peak_power_watts == pytest.approx(225)


def test_a_counter_reset_counts_nothing_and_a_shared_device_is_not_counted_twice() -> None:
    both = {"1": (0,), "2": (0,)}
    ledger = run(
        [
            snapshot(0.0, 5000.0, (1.0, 0.0), both),
            snapshot(1.0, 5200.0, (1.0, 0.0), both),  # 200 J on gpu 0, two holders: 100 each
            snapshot(2.0, 10.0, (1.0, 0.0), both),  # a reset: nothing
            snapshot(3.0, 110.0, (1.0, 0.0), both),  # 100 J: 50 each
        ]
    )
    one, two = ledger.running
    assert one.energy_joules == pytest.approx(150) and two.energy_joules == pytest.approx(150)


def test_errors_throttling_checks_peaks_and_the_source_down_keeps_a_job() -> None:
    health = HealthVerdict(
        gpus=(GpuHealth(1, DIES[1].key, checks=(HealthCheck("ecc_uncorrectable", "critical", "x", 0.0),)),)
    )
    ledger = run(
        [
            snapshot(0.0, 0.0, (0.5, 0.5), {"9": (0, 1)}, ecc=5),
            snapshot(1.0, 100.0, (0.5, 0.5), {"9": (0, 1)}, ecc=7, throttled=True),
            snapshot(2.0, 200.0, (0.5, 0.5), {}, ecc=7, up=False),  # the source cannot say: still running
        ],
        health=health,
    )
    (job,) = ledger.running
    die0, die1 = job.devices
    assert die0.errors == {"ecc_correctable": 2} and die0.throttled_seconds == {"ppt0": 1.0}
    assert die1.failed_checks == ("ecc_uncorrectable",) and die0.failed_checks == ()
    assert die1.peak_temperatures_celsius["junction"] == pytest.approx(61.02)
    assert die0.vram_peak_bytes == pytest.approx(1.2e9)
    assert job.energy_joules == pytest.approx(200)


def test_a_restart_charges_the_gap_from_the_state_file(tmp_path: Path) -> None:
    jobs = {"5": (0, 1)}
    store = LedgerStore(str(tmp_path / "state" / "jobs.json"))
    before = run([snapshot(0.0, 0.0, (0.5, 0.5), jobs), snapshot(1.0, 100.0, (0.5, 0.5), jobs)])
    assert store.save(before)
    again = store.load()
    assert again == before
    # 30 s later, a new daemon whose attribution has not read yet: the job is charged the gap
    after = run([snapshot(31.0, 3100.0, (0.5, 0.5), {}, up=False), snapshot(32.0, 3200.0, (0.5, 0.5), jobs)], again)
    (job,) = after.running
    assert job.energy_joules == pytest.approx(3200) and job.gpu_seconds == pytest.approx(64)


def test_a_state_file_not_ours_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "jobs.json"
    path.write_text('{"format": 99}')
    assert LedgerStore(str(path)).load() == Ledger()
    assert (tmp_path / "jobs.json.bad").is_file() and not path.exists()
    with pytest.raises(ValueError, match="format"):
        ledger_from_json([])


def test_ended_jobs_are_bounded_and_only_the_newest_keep_their_plots() -> None:
    ledger = Ledger()
    limits = Limits(keep_seconds=1000.0, max_ended=3, max_histories=1)
    for n in range(6):
        t = 10.0 * n
        ledger, _ = account(ledger, snapshot(t, t, (0.5, 0.5), {str(n): (0,)}), None, limits)
        ledger, _ = account(ledger, snapshot(t + 1, t + 1, (0.5, 0.5), {str(n): (0,)}), None, limits)
        ledger, _ = account(ledger, snapshot(t + 2, t + 2, (0.5, 0.5), {}), None, limits)
    assert [j.job_id for j in ledger.ended] == ["3", "4", "5"]
    assert [bool(j.devices[0].history) for j in ledger.ended] == [False, False, True]
    assert json.loads(json.dumps(ledger_json(ledger)))["format"] == 1


@given(st.lists(st.one_of(st.none(), st.floats(0.0, 1.0)), min_size=1, max_size=8))
def test_split_ratios_always_sum_to_one(busy: list[float | None]) -> None:
    ratios = split_ratios(busy)
    assert len(ratios) == len(busy) and sum(ratios) == pytest.approx(1.0)
    assert all(r >= 0 for r in ratios)


def test_pods_are_holders_by_namespace_and_name_and_the_api_serves_them() -> None:
    from starlette.testclient import TestClient

    from exporter.cycle import PublishedState
    from exporter.web.routes import create_app

    def pods(t: float, held: bool) -> Snapshot:
        base = snapshot(t, 100.0 * t, (0.5, 0.5), {})
        allocations = (
            tuple(
                Allocation(
                    gpu,
                    "kubernetes",
                    str(gpu),
                    "amd.com/gpu",
                    (("pod", "train"), ("namespace", "ml"), ("container", c)),
                )
                for gpu, c in ((0, "main"), (1, "side"))
            )
            if held
            else ()
        )
        attribution = Attribution(
            ("pod", "namespace", "container"), allocations=allocations, sources_up=frozen_map({"kubernetes": True})
        )
        return dataclasses.replace(base, attribution=attribution)

    ledger, _ = account(Ledger(), pods(0.0, True))
    ledger, _ = account(ledger, pods(1.0, True))
    ledger, ended = account(ledger, pods(2.0, False))
    (job,) = ended
    assert (job.job_id, job.scheduler) == ("ml/train", "kubernetes")
    assert dict(job.labels)["container"] == "main,side" and job.energy_joules == pytest.approx(200)
    client = TestClient(create_app(lambda: PublishedState(jobs=ledger), "/metrics", node="n1"))
    one = client.get("/api/v1/jobs/ml/train")
    assert one.status_code == 200 and one.json()["state"] == "ended" and one.json()["devices"][0]["place"] == "die 0"
    listing = client.get("/api/v1/jobs").json()
    assert [j["job_id"] for j in listing["ended"]] == ["ml/train"] and "history" not in listing["ended"][0]["devices"][
        0
    ]
    assert client.get("/api/v1/jobs/nope").status_code == 404
    off = TestClient(create_app(lambda: PublishedState(), "/metrics")).get("/api/v1/jobs")
    assert off.status_code == 404 and "accounting is off" in off.json()["error"]


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)


@given(_JSON)
def test_a_state_file_of_any_json_is_a_ledger_or_one_value_error(data: object) -> None:
    with contextlib.suppress(ValueError):
        ledger_from_json(data)


@given(st.sampled_from(["running", "ended", "readings"]), _JSON)
def test_a_state_file_with_one_part_replaced_is_a_ledger_or_one_value_error(part: str, value: object) -> None:
    jobs = {"1": (0, 1)}
    good = ledger_json(run([snapshot(0.0, 0.0, (0.5, 0.5), jobs), snapshot(1.0, 50.0, (0.5, 0.5), jobs)]))
    with contextlib.suppress(ValueError):
        ledger_from_json({**good, part: value})
