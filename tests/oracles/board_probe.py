"""Runs INSIDE the sid chroot (Debian's `amdsmi` module): the board/ readings amdsmi gives for
every GPU (GPUBOARD_* / BASEBOARD_* temperatures, the node's NPM info) as one JSON document.
Standard library only."""

import json

import amdsmi as smi


def call(function, *args):
    try:
        return {"ok": function(*args)}
    except Exception as error:  # the test decides which failures matter
        return {"error": f"{type(error).__name__}: {error}"}


smi.amdsmi_init(smi.AmdSmiInitFlags.INIT_AMD_GPUS)
devices = []
for handle in smi.amdsmi_get_processor_handles():
    temps = {
        kind.name: call(smi.amdsmi_get_temp_metric, handle, kind, smi.AmdSmiTemperatureMetric.CURRENT)
        for kind in smi.AmdSmiTemperatureType
        if kind.name.startswith(("GPUBOARD_", "BASEBOARD_")) and not kind.name.endswith(("_FIRST", "_LAST"))
    }
    node = call(smi.amdsmi_get_node_handle, handle)
    npm = call(smi.amdsmi_get_npm_info, node["ok"]) if "ok" in node else node
    devices.append({"bdf": smi.amdsmi_get_gpu_device_bdf(handle), "temps": temps, "npm": npm})
print(json.dumps(devices))
