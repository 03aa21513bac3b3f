"""The job dashboard: one Slurm/Flux/PBS job (or pod) over its lifetime, in the shape of AMD
device-metrics-exporter's job view (the job's GPUs, power, utilisation, temperatures, memory, errors),
from the exporter's per-job counters (exact, split per package: docs/accounting.md) and each of its
GPUs' series joined through amdgpu_job_info. The job id is a textbox (a job list with links is the
first panel, whose rows open the job on its node), so the dashboard opens on any job, running or
ended, Prometheus still holds; the per-GPU panels read the chosen node's series only."""

from __future__ import annotations

from .panels import ANY_IS_BAD, Dashboard, Panel, Query, Row, celsius, temperature_steps
from .render import DATASOURCE
from .thresholds import Thresholds
from .variables import datasource_variable, query_variable

JOB_UID = "amdgpu-job"
EMPTY = "no job with this id held a GPU in the time range (set Job ID; the list above has the recent ones)"
NODE = 'instance="$instance"'
HOLDS = 'max without (job_user, job_partition) (amdgpu_job_info{instance="$instance", job_id="$job_id"})'
PER_GPU = "gpu {{gpu}}"


def of_job(expr: str) -> str:
    """A per-GPU series of the chosen node restricted to the job's GPUs there (amdgpu_job_info), job_id
    added to each: one node's series, never the fleet's (a job's GPUs are found through the table)."""
    return f"{expr} * on (instance, job, gpu) group_left (job_id) {HOLDS}"


def job_id_variable() -> dict[str, object]:
    return {
        "current": {"text": "", "value": ""},
        "description": "The Slurm/Flux/PBS job id (a pod: its namespace/name).",
        "hide": 0,
        "label": "Job ID",
        "name": "job_id",
        "options": [{"selected": True, "text": "", "value": ""}],
        "query": "",
        "skipUrlSync": False,
        "type": "textbox",
    }


def job_link() -> dict[str, object]:
    return {
        "title": "Open this job",
        "url": "/d/amdgpu-job/amdgpu-job?${datasource:queryparam}&var-job_id=${__data.fields.job_id}"
        "&var-instance=${__data.fields.instance}&${__url_time_range}",
        "targetBlank": False,
    }


def summary_row() -> Row:
    return Row(
        "Job",
        (
            Panel(
                "table",
                "Jobs in range",
                "Every job that held a GPU in the time range, with its node, user and GPUs held; click a row "
                "to open it. The exact figures of a job are `amdgpu-exporter job-report ID` on its node.",
                Query(
                    "count by (job_id, job_user, instance) (max_over_time(amdgpu_job_info[$__range]))",
                    "{{job_id}}",
                ),
                unit="none",
                width=24,
                height=7,
                may_be_empty="no job held a GPU in the time range (attribution is off, or the GPUs were free)",
                links=(job_link(),),
            ),
            Panel(
                "stat",
                "Energy",
                "Energy the job has used so far, every node summed: the daemon's own count from every 1 Hz "
                "energy tick, a shared package split by busy (docs/accounting.md).",
                Query('sum(max_over_time(amdgpu_job_energy_joules_total{job_id="$job_id"}[$__range]))', "energy"),
                unit="joule",
                width=6,
                height=5,
                may_be_empty=EMPTY,
            ),
            Panel(
                "stat",
                "GPU-hours",
                "GPU-hours held so far (a die or a partition counts as one GPU), every node summed.",
                Query('sum(max_over_time(amdgpu_job_gpu_seconds_total{job_id="$job_id"}[$__range])) / 3600', "GPU-h"),
                unit="none",
                width=6,
                height=5,
                may_be_empty=EMPTY,
            ),
            Panel(
                "stat",
                "GPUs",
                "GPUs (dies, partitions) the job held on any node in the range.",
                Query('count(max_over_time(amdgpu_job_info{job_id="$job_id"}[$__range]))', "GPUs"),
                unit="none",
                width=6,
                height=5,
                may_be_empty=EMPTY,
            ),
            Panel(
                "stat",
                "ECC errors",
                "ECC errors (correctable, uncorrectable, deferred) counted on the job's GPUs of the chosen node "
                "in the range.",
                Query(
                    of_job('sum without (block) (increase(amdgpu_ecc_errors_total{instance="$instance"}[$__range]))'),
                    "{{type}}",
                ),
                unit="none",
                width=6,
                height=5,
                steps=ANY_IS_BAD,
                may_be_empty=EMPTY,
            ),
        ),
    )


def power_row() -> Row:
    return Row(
        "Power and energy",
        (
            Panel(
                "timeseries",
                "Job power",
                "The job's power on the chosen node: the rate of its energy count, its share of each package "
                "included (MI250X die 1, MI300 partitions 1..N-1 get theirs).",
                Query(
                    'rate(amdgpu_job_energy_joules_total{instance="$instance", job_id="$job_id"}[$__rate_interval])',
                    "{{instance}}",
                ),
                unit="watt",
                width=12,
                minimum=0,
                may_be_empty=EMPTY,
            ),
            Panel(
                "timeseries",
                "Job energy",
                "The job's energy count on the chosen node over its lifetime.",
                Query('amdgpu_job_energy_joules_total{instance="$instance", job_id="$job_id"}', "{{instance}}"),
                unit="joule",
                width=12,
                minimum=0,
                may_be_empty=EMPTY,
            ),
        ),
    )


def gpus_row(t: Thresholds) -> Row:
    return Row(
        "The job's GPUs on the chosen node",
        (
            Panel(
                "timeseries",
                "GFX activity",
                "Graphics/compute engine busy of each of the job's GPUs.",
                Query(of_job('amdgpu_busy_ratio{instance="$instance", engine="gfx"}'), PER_GPU),
                unit="percentunit",
                width=8,
                minimum=0,
                maximum=1,
                may_be_empty=EMPTY,
            ),
            Panel(
                "timeseries",
                "Memory activity",
                "Memory controller busy of each of the job's GPUs (a partition's is its socket's, on partition 0).",
                Query(of_job('amdgpu_busy_ratio{instance="$instance", engine="memory"}'), PER_GPU),
                unit="percentunit",
                width=8,
                minimum=0,
                maximum=1,
                may_be_empty=EMPTY,
            ),
            Panel(
                "timeseries",
                "VRAM used",
                "VRAM in use on each of the job's GPUs.",
                Query(of_job('amdgpu_memory_used_bytes{instance="$instance", pool="vram"}'), PER_GPU),
                unit="bytes",
                width=8,
                minimum=0,
                may_be_empty=EMPTY,
            ),
            Panel(
                "timeseries",
                "Junction temperature",
                f"Hotspot temperature of each of the job's GPUs; red from {celsius(t.junction_hot_celsius)} "
                "(the in-daemon junction alert).",
                Query(of_job('amdgpu_temperature_celsius{instance="$instance", sensor="junction"}'), PER_GPU),
                unit="celsius",
                width=8,
                steps=temperature_steps(t),
                threshold_line=True,
                may_be_empty=EMPTY,
            ),
            Panel(
                "timeseries",
                "Memory temperature",
                "HBM temperature of each of the job's GPUs (the junction alert's levels drawn for scale).",
                Query(of_job('amdgpu_temperature_celsius{instance="$instance", sensor="memory"}'), PER_GPU),
                unit="celsius",
                width=8,
                steps=temperature_steps(t),
                threshold_line=True,
                may_be_empty=EMPTY,
            ),
            Panel(
                "timeseries",
                "Throttling",
                "Throttle reasons active on the job's GPUs (1: the clocks are held back for this reason).",
                Query(of_job('amdgpu_throttle_active{instance="$instance"}'), "gpu {{gpu}} {{reason}}"),
                unit="none",
                width=8,
                minimum=0,
                may_be_empty=EMPTY + "; or nothing throttled",
            ),
        ),
    )


def job_dashboard(t: Thresholds) -> Dashboard:
    return Dashboard(
        uid=JOB_UID,
        title="AMD GPU / Job",
        description="One Slurm, Flux or PBS job (or pod) over its lifetime: energy and GPU-hours from the "
        "exporter's per-job accounting, and its GPUs' activity, memory, temperatures, throttling and errors.",
        variables=(
            datasource_variable(),
            job_id_variable(),
            query_variable("instance", "Node", "label_values(amdgpu_up, instance)"),
        ),
        rows=(summary_row(), power_row(), gpus_row(t)),
        time_from="now-24h",
        annotations=(
            {
                "datasource": DATASOURCE,
                "enable": True,
                "expr": f"{HOLDS} * 0 + 1",
                "hide": False,
                "iconColor": "blue",
                "name": "Job held GPUs",
                "step": "1m",
                "tagKeys": "instance,gpu",
                "titleFormat": "job $job_id on gpu {{gpu}}",
                "useValueForTime": False,
            },
        ),
    )
