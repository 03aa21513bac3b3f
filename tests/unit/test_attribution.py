"""Pure attribution code: device names, the kubelet's answer, Slurm state files, KFD process files, matching."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.attribution import kubernetes, processes, slurm
from exporter.attribution.matching import labels_by_gpu, normalize_bdf, resolve, xcp_index
from exporter.model import (
    AttributionReport,
    ByBdf,
    ByDrm,
    ByGpuIndex,
    ByLocation,
    ByPhysicalIndex,
    ByXcp,
    Claim,
    DeviceRef,
)

# --- device names ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0000:19:00.0", "0000:19:00.0"),
        ("0000:C1:00.0", "0000:c1:00.0"),
        ("c1:00.1", "0000:c1:00.1"),
        ("0001:9A:1F.7", "0001:9a:1f.7"),
        ("0000:19:00.8", None),
        ("0000:19:00", None),
        ("amdgpu_xcp_1", None),
        ("", None),
    ],
)
def test_normalize_bdf(text: str, expected: str | None) -> None:
    assert normalize_bdf(text) == expected


@given(st.integers(0, 0xFFFF), st.integers(0, 0xFF), st.integers(0, 0x1F), st.integers(0, 7), st.booleans())
def test_bdf_any_case_round_trips(domain: int, bus: int, dev: int, fn: int, upper: bool) -> None:
    canonical = f"{domain:04x}:{bus:02x}:{dev:02x}.{fn}"
    assert normalize_bdf(canonical.upper() if upper else canonical) == canonical


# Arbitrary text, and (as often) text made of the names' own pieces, so that many draws are names.
_NAME_PIECES = ["0000", "19", "1A", "00", ":", ".", "0", "7", "8", "amdgpu_xcp", "AMDGPU_XCP", "_", "gpu-", "-",
                "1", "129", "cpx", "nps4", " ", "\n", "x"]  # fmt: skip
_device_names = st.one_of(st.text(max_size=40), st.lists(st.sampled_from(_NAME_PIECES), max_size=10).map("".join))
_CANONICAL_BDF = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


@given(_device_names)
def test_any_device_name_reads_as_one_device_or_none(text: str) -> None:
    bdf = normalize_bdf(text)
    if bdf is not None:  # canonical: lower case, a domain, and a fixed point of normalization
        assert _CANONICAL_BDF.fullmatch(bdf), bdf
        assert normalize_bdf(bdf) == bdf and normalize_bdf(text.upper()) == bdf
    xcp = xcp_index(text)
    assert xcp is None or (0 <= xcp <= 999 and xcp_index(f"amdgpu_xcp_{xcp}") == xcp)
    assert bdf is None or xcp is None, "a name is a BDF or a partition, never both"
    plugin = kubernetes.device_plugin_device(text)
    assert plugin == (ByBdf(bdf) if bdf else ByXcp(xcp) if xcp is not None else None)
    dra = kubernetes.dra_device(text)
    # A DRA name of its own form starts with gpu-; any other reads as the device plugin's would.
    assert (isinstance(dra, ByDrm | ByPhysicalIndex) and text.startswith("gpu-")) or dra == plugin


def test_device_plugin_and_dra_names() -> None:
    assert kubernetes.device_plugin_device("0000:19:00.0") == ByBdf("0000:19:00.0")
    assert kubernetes.device_plugin_device("amdgpu_xcp_7") == ByXcp(7)
    assert kubernetes.device_plugin_device("amdgpu_xcp.12") == ByXcp(12)
    assert kubernetes.device_plugin_device("GPU-4a3f") is None
    assert kubernetes.dra_device("gpu-1-129") == ByDrm(1, 129)
    assert kubernetes.dra_device("gpu-3-cpx-nps4") == ByPhysicalIndex(3)
    assert kubernetes.dra_device("gpu-vfio-0") is None
    assert kubernetes.dra_device("0000:3b:00.0") == ByBdf("0000:3b:00.0")


# --- the kubelet's answer ---------------------------------------------------------------------------

_names = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF), max_size=12)
_device_ids = st.one_of(
    st.builds(lambda b, f: f"0000:{b:02X}:00.{f}", st.integers(0, 255), st.integers(0, 7)),
    st.builds(lambda n, sep: f"amdgpu_xcp{sep}{n}", st.integers(0, 63), st.sampled_from("._")),
    _names,
)
_resources = st.sampled_from(["amd.com/gpu", "amd.com/cpx_nps4", "nvidia.com/gpu", "example.com/x"])
_containers = st.lists(
    st.tuples(_names, st.dictionaries(_resources, st.lists(_device_ids, max_size=3), max_size=2)), max_size=3
)
_pods = st.lists(st.tuples(_names, _names, _containers), max_size=4)


@settings(deadline=None)  # the first example compiles the pod-resources protos
@given(_pods)
def test_claims_are_every_amd_device_of_every_container(pods: list) -> None:
    pb = kubernetes.protos()
    response = pb.ListPodResourcesResponse()
    expected = set()
    for pod, namespace, containers in pods:
        message = response.pod_resources.add(name=pod, namespace=namespace)
        for container, devices in containers:
            c = message.containers.add(name=container)
            for resource, ids in devices.items():
                c.devices.add(resource_name=resource, device_ids=ids)
                for device_id in ids:
                    name = kubernetes.device_plugin_device(device_id)
                    if resource.startswith("amd.com/") and name is not None:
                        labels = (("pod", pod), ("namespace", namespace), ("container", container))
                        expected.add(Claim(name, device_id, labels, resource))
    claims = kubernetes.claims_from_list_response(response.SerializeToString())
    assert set(claims) == expected


def test_dra_claims_by_driver_prefix() -> None:
    pb = kubernetes.protos()
    response = pb.ListPodResourcesResponse()
    container = response.pod_resources.add(name="p", namespace="n").containers.add(name="c")
    dynamic = container.dynamic_resources.add(claim_name="gpus", claim_namespace="n")
    dynamic.claim_resources.add(driver_name="gpu.amd.com", pool_name="node", device_name="gpu-2-130")
    dynamic.claim_resources.add(driver_name="gpu.nvidia.com", pool_name="node", device_name="gpu-0")
    claims = kubernetes.claims_from_list_response(response.SerializeToString())
    assert [(c.device, c.device_id, c.resource) for c in claims] == [(ByDrm(2, 130), "gpu-2-130", "gpu.amd.com")]
    # The resource prefix is configurable.
    container.devices.add(resource_name="example.com/amd", device_ids=["0000:19:00.0"])
    claims = kubernetes.claims_from_list_response(response.SerializeToString(), resource_prefixes=("example.com/",))
    assert {c.device for c in claims} == {ByDrm(2, 130), ByBdf("0000:19:00.0")}


@given(st.binary(max_size=200))
def test_kubelet_bytes_never_raise_anything_but_a_read_error(data: bytes) -> None:
    try:
        claims = kubernetes.claims_from_list_response(data)
    except kubernetes.PodResourcesError as error:
        assert "\n" not in str(error)
    else:
        assert all(isinstance(c, Claim) for c in claims)


# --- Slurm state files ------------------------------------------------------------------------------


def test_our_state_file_and_amd_exporters() -> None:
    ours = json.dumps({"SLURM_JOB_ID": "1234", "SLURM_JOB_USER": "alice", "SLURM_JOB_PARTITION": "mi300"}).encode()
    claim = slurm.parse_state_file("3.1234", ours)
    assert claim is not None
    assert claim.device == ByGpuIndex(3)
    assert dict(claim.labels) == {"job_id": "1234", "job_user": "alice", "job_partition": "mi300"}
    # AMD device-metrics-exporter's prolog: file named by the index only, unquoted echo of the JSON.
    dme = (
        b'{ "SLURM_JOB_ID": "77", "SLURM_JOB_USER": "bob", "SLURM_JOB_PARTITION": "gpu", "SLURM_CLUSTER_NAME": "c",'
        b' "SLURM_JOB_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd" }\n'
    )
    claim = slurm.parse_state_file("1", dme)
    assert claim is not None and claim.device == ByGpuIndex(1) and dict(claim.labels)["job_user"] == "bob"
    # Not records of a job: a name/content mismatch, half-written JSON, no job id, other files.
    assert slurm.parse_state_file("3.999", ours) is None
    assert slurm.parse_state_file("3.1234", ours[:20]) is None
    assert slurm.parse_state_file("3", b'{"SLURM_JOB_USER": "x"}') is None
    assert slurm.parse_state_file(".tmp.1234.abcdef", ours) is None
    assert slurm.parse_state_file("3.1234", b"[1, 2]") is None


@given(st.text(max_size=12), st.binary(max_size=120))
def test_state_files_never_raise(name: str, data: bytes) -> None:
    claim = slurm.parse_state_file(name, data)
    assert claim is None or isinstance(claim.device, ByGpuIndex)


@given(st.integers(0, 9999), st.integers(1, 10**12), _names, _names)
def test_state_file_round_trip(index: int, job: int, user: str, partition: str) -> None:
    data = json.dumps({"SLURM_JOB_ID": str(job), "SLURM_JOB_USER": user, "SLURM_JOB_PARTITION": partition})
    claim = slurm.parse_state_file(f"{index}.{job}", data.encode())
    assert claim is not None
    assert claim.device == ByGpuIndex(index)
    assert dict(claim.labels) == {"job_id": str(job), "job_user": user.strip(), "job_partition": partition.strip()}


# --- KFD process files ------------------------------------------------------------------------------


@given(st.integers(0, 0xFFFF), st.integers(0, 0xFF), st.integers(0, 0x1F), st.integers(0, 7), st.integers(0, 7))
def test_topology_location_round_trip(domain: int, bus: int, dev: int, fn: int, partition: int) -> None:
    location = (partition << 28) | (bus << 8) | (dev << 3) | fn
    props = f"cpu_cores_count 0\nsimd_count 304\nlocation_id {location}\ndomain {domain}\n".encode()
    assert processes.location_from_node(b"48712\n", props) == (
        48712,
        ByLocation(f"{domain:04x}:{bus:02x}:{dev:02x}.{fn}", partition),
    )


def test_cpu_node_is_no_gpu() -> None:
    assert processes.location_from_node(b"0\n", b"cpu_cores_count 64\nlocation_id 0\n") is None


def test_parse_process() -> None:
    files = {
        "vram_48712": b"1073741824\n",
        "sdma_48712": b"2500000\n",
        "stats_48712/cu_occupancy": b"38\n",
        "vram_9999": b"garbage\n",
        "vram_7777": b"0\n",  # every GPU of the node has a file; no VRAM and no queue there: not its GPU
        "sdma_7777": b"0\n",
        "queues/0/gpuid": b"9999\n",
        "queues/1/gpuid": b"5555\n",
    }
    usages = processes.parse_process(4242, files, "python3")
    assert usages == (
        processes.ProcessGpuUsage(4242, 5555, "python3", None, None, None),
        processes.ProcessGpuUsage(4242, 9999, "python3", None, None, None),
        processes.ProcessGpuUsage(4242, 48712, "python3", 1073741824, 2.5, 38),
    )


@given(st.dictionaries(st.text(max_size=24), st.binary(max_size=24), max_size=8), st.integers(1, 2**22))
def test_process_files_never_raise(files: dict, pid: int) -> None:
    for usage in processes.parse_process(pid, files):
        assert usage.pid == pid
        assert usage.vram_bytes is None or usage.vram_bytes >= 0


@given(st.lists(st.tuples(st.integers(1, 500), st.integers(0, 2**40) | st.none()), max_size=40), st.integers(0, 20))
def test_top_n_by_vram_per_gpu(procs: list, top: int) -> None:
    refs = (DeviceRef(0, "0000:19:00.0"), DeviceRef(1, "0000:3b:00.0"))
    locations = {11: ByLocation("0000:19:00.0", 0), 22: ByLocation("0000:3b:00.0", 0)}
    usages = [processes.ProcessGpuUsage(pid, (11, 22)[i % 2], "p", v, None, None) for i, (pid, v) in enumerate(procs)]
    result = processes.attribute(refs, usages, locations, top)
    for gpu, gpu_id in ((0, 11), (1, 22)):
        mine = [u for u in result if u.gpu == gpu]
        candidates = [u for u in usages if u.gpu_id == gpu_id]
        assert len(mine) == min(top, len(candidates))
        # The largest known VRAM first, processes of unknown VRAM only after every known one.
        known = sorted((u.vram_bytes for u in candidates if u.vram_bytes is not None), reverse=True)
        assert [u.vram_bytes for u in mine] == (known + [None] * len(candidates))[: len(mine)]


# --- matching ---------------------------------------------------------------------------------------

REFS = (
    DeviceRef(0, "0000:19:00.0", partition=0, card=1, render_minor=128),
    DeviceRef(1, "0000:19:00.0", partition=1, xcp=0, card=2, render_minor=129),
    DeviceRef(2, "0000:3b:00.0", card=3, render_minor=130),
    DeviceRef(3, "0000:c1:00.0", card=4, render_minor=131),
)


def _claim(device, pod: str, device_id: str = "x") -> Claim:  # type: ignore[no-untyped-def]
    return Claim(device, device_id, (("pod", pod), ("namespace", "ns"), ("container", "c")), "amd.com/gpu")


def test_resolve_each_kind_of_name() -> None:
    report = AttributionReport(
        "kubernetes",
        up=True,
        claims=(
            _claim(ByBdf("0000:19:00.0"), "a"),  # partition 0 only, not the whole socket
            _claim(ByXcp(0), "b"),
            _claim(ByDrm(3, 130), "c"),
            _claim(ByPhysicalIndex(2), "d"),  # third physical GPU: c1
            _claim(ByBdf("0000:99:00.0"), "nobody"),  # not a device of this snapshot
        ),
    )
    assert [(a.gpu, dict(a.labels)["pod"]) for a in resolve(REFS, [report])] == [(0, "a"), (1, "b"), (2, "c"), (3, "d")]
    # A source that is down keeps its last claims for a while (its report still holds them), then drops them.
    held = resolve(REFS, [AttributionReport("kubernetes", up=False, claims=report.claims)])
    assert held == resolve(REFS, [report])
    assert resolve(REFS, [AttributionReport("kubernetes", up=False, claims=())]) == ()


def test_labels_for_every_device_and_shared_devices_joined() -> None:
    report = AttributionReport(
        "kubernetes", up=True, claims=(_claim(ByBdf("0000:3b:00.0"), "z"), _claim(ByBdf("0000:3b:00.0"), "y"))
    )
    labels = labels_by_gpu(range(4), ("pod", "namespace", "container"), resolve(REFS, [report]))
    assert labels[0] == {"pod": "", "namespace": "", "container": ""}
    assert labels[2] == {"pod": "y,z", "namespace": "ns", "container": "c"}
    assert set(labels) == {0, 1, 2, 3}


def test_a_crowded_gpu_gets_bounded_label_values() -> None:
    from exporter.attribution.matching import MAX_LABEL_CHARS, joined_label_value

    pods = {f"train-worker-{n:03d}" for n in range(500)}
    value = joined_label_value(pods)
    assert len(value) <= MAX_LABEL_CHARS
    shown = value.split(",")
    assert shown[-1] == f"+{500 - (len(shown) - 1)}" and shown[:-1] == sorted(pods)[: len(shown) - 1]
    assert joined_label_value({"b", "a"}) == "a,b" and joined_label_value(()) == ""
    assert joined_label_value({"x" * 300}) == "x" * MAX_LABEL_CHARS


def test_a_hung_read_marks_the_source_down_at_once_and_holds_one_thread() -> None:
    import threading

    from exporter.attribution.schedule import ScheduledAttribution
    from exporter.model import ByGpuIndex, Claim

    release = threading.Event()
    started: list[int] = []
    claim = Claim(ByGpuIndex(0), "0", (("job_id", "1"),), "slurm")

    def read() -> tuple[Claim, ...]:
        started.append(1)
        if len(started) == 2:  # the second read hangs (a FIFO, a hard-mounted directory)
            release.wait(30)
        return (claim,)

    now = [100.0]
    source = ScheduledAttribution("slurm", read, interval=1.0, keep_for=0.0, clock=lambda: now[0], deadline=0.2)
    assert source.read_once().claims == (claim,)
    now[0] += 1
    late = source.read_once()
    assert not late.up and late.claims == () and "no answer within 0.2 s" in late.error
    now[0] += 5
    still = source.read_once()  # the hung read has not returned: no second reader is started
    assert not still.up and "has not returned for 5 s" in still.error and len(started) == 2
    release.set()
    deadline = threading.Event()
    while any(t.name == "slurm-read" for t in threading.enumerate()) and not deadline.wait(0.01):
        pass
    assert source.read_once().up and len(started) == 3


def test_a_report_older_than_its_age_limit_is_not_served_as_current() -> None:
    from exporter.attribution.schedule import ScheduledAttribution
    from exporter.model import ByGpuIndex, Claim

    claim = Claim(ByGpuIndex(0), "0", (("job_id", "1"),), "slurm")
    now = [100.0]
    source = ScheduledAttribution("slurm", lambda: (claim,), interval=1.0, keep_for=0.0, clock=lambda: now[0])
    source.read_once()
    assert source.current().up
    now[0] += source.max_age + 1  # the schedule thread stalled or died: nothing read since
    stale = source.current()
    assert not stale.up and stale.claims == () and "no report for" in stale.error
