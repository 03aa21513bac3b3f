"""The clock-down commands against the real rocm-smi CLI (Debian's 5.2.3), without ever running one.

The exporter never writes to a GPU, and neither may its tests: the real script is run with its
argument parser stopped right after parsing (so nothing touches a device), which shows the commands
are what rocm-smi accepts; and its own out-of-spec confirmation is called with the --autorespond
value the command passes, which shows the command runs unattended.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.alerting.clockdown import set_ceiling_command, undo_command
from tests.realtools import require_tool

pytestmark = pytest.mark.integration

# Runs the rocm-smi script as its own __main__ and prints the parsed arguments instead of acting on them.
PARSE_ONLY = """
import argparse, json, os, runpy, sys
parse = argparse.ArgumentParser.parse_args
def parsed_only(self, *args, **kwargs):
    namespace = parse(self, *args, **kwargs)
    print(json.dumps({k: v for k, v in vars(namespace).items() if v not in (None, False, [])}), flush=True)
    os._exit(0)
argparse.ArgumentParser.parse_args = parsed_only
script = sys.argv[1]
sys.argv = ["rocm-smi", *sys.argv[2:]]
runpy.run_path(script, run_name="__main__")
"""

# Loads the script's functions (not its main) and asks its confirmation with the given answer.
CONFIRM = """
import contextlib, io, runpy, sys
functions = runpy.run_path(sys.argv[1], run_name="rocm_smi_cli")
answer = sys.argv[2] if len(sys.argv) > 2 else None
outcome = "accepted"
with contextlib.redirect_stdout(io.StringIO()):  # the warning text
    try:
        functions["confirmOutOfSpecWarning"](answer)
    except SystemExit as refused:
        outcome = f"refused: {refused.code}"
    except EOFError:
        outcome = "prompted"
print(outcome)
"""


def rocm_smi_script() -> str:
    return str(Path(require_tool("rocm-smi")).resolve())


def parsed(script: str, command: str) -> dict[str, object]:
    argv = shlex.split(command)
    assert argv[0] == "rocm-smi"
    done = subprocess.run(
        [sys.executable, "-c", PARSE_ONLY, script, *argv[1:]],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, f"rocm-smi does not accept {command!r}: {done.stderr.strip()[-300:]}"
    return dict(json.loads(done.stdout.splitlines()[-1]))


def confirmation(script: str, *answer: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", CONFIRM, script, *answer],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_suggested_command_is_a_valid_unattended_rocm_smi_command() -> None:
    script = rocm_smi_script()
    command = set_ceiling_command("rocm-smi", 3, "0000:c1:00.0", 500, 1548)
    assert parsed(script, command) == {"device": [3], "setsrange": ["500", "1548"], "autorespond": "yes"}
    # --setsrange asks to accept an out-of-spec warning: without an answer it prompts (and a command
    # pasted into a non-interactive shell stops there); the command's answer is accepted.
    autorespond = shlex.split(command)[shlex.split(command).index("--autorespond") + 1]
    assert confirmation(script) == "prompted"
    assert confirmation(script, autorespond) == "accepted"
    assert confirmation(script, "sure").startswith("refused")


def test_the_undo_command_is_a_valid_rocm_smi_command() -> None:
    assert parsed(rocm_smi_script(), undo_command("rocm-smi", 3, "0000:c1:00.0")) == {
        "device": [3],
        "resetclocks": True,
    }


def test_the_parse_check_can_fail() -> None:
    with pytest.raises(AssertionError, match="does not accept"):
        parsed(rocm_smi_script(), "rocm-smi -d 3 --setceiling 1548")
