"""deploy/systemd: the unit passes systemd's own checks and its ExecStart serves as the unit would run it.

systemd is not PID 1 here, so its sandbox is rebuilt from the unit with the pieces systemd itself
uses: a private mount namespace puts a freshly installed venv at the unit's ExecStart path
(unshare); setpriv gives a transient uid from the DynamicUser range with the unit's groups, no new
privileges and an empty capability bounding set; a last wrapper sets UMask=, the kernel's
refuse-write-execute mode (MemoryDenyWriteExecute=) and a libseccomp filter made from
SystemCallFilter=, SystemCallErrorNumber= and RestrictAddressFamilies=; the environment is
exactly what EnvironmentFile= would give. Not reproduced: ProtectSystem= and the other mount
options, PrivateDevices=, PrivateTmp= (the exporter writes nothing outside /tmp and /dev/shm).
"""

from __future__ import annotations

import errno
import grp
import json
import pwd
import re
import signal
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.harness import free_port, wait_until
from tests.realtools import require_tool
from tests.release import install_release

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "deploy" / "systemd" / "amdgpu-exporter.service"
ENV_FILE = REPO / "deploy" / "systemd" / "amdgpu-exporter.env"
MAX_EXPOSURE = 2.0
# The interpreter the unit's install instructions use (`python3 -m venv /opt/amdgpu-exporter`);
# it must be one an unprivileged uid can execute.
SYSTEM_PYTHON = Path("/usr/bin/python3")
# systemd's DynamicUser= range.
DYNAMIC_UID_RANGE = range(61184, 65520)
# What systemd puts in a service's environment before EnvironmentFile= (DynamicUser, no User=).
SYSTEMD_BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin", "LANG": "C.UTF-8"}

# The last step before the exporter, run as the service's uid after setpriv (as systemd, it
# applies the filters after dropping privileges): the unit's UMask=, the kernel's
# refuse-write-execute mode for MemoryDenyWriteExecute= (prctl PR_SET_MDWE, kept across exec
# and fork), and a seccomp filter built with libseccomp from SystemCallFilter=,
# SystemCallErrorNumber= and RestrictAddressFamilies=. Then it execs the rest of argv.
SANDBOX_EXEC = r"""
import ctypes, json, os, sys
spec = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
PR_SET_MDWE, PR_GET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 66, 1
if libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0 or libc.prctl(PR_GET_MDWE, 0, 0, 0, 0) != 1:
    sys.exit("prctl(PR_SET_MDWE) failed: errno %d" % ctypes.get_errno())
os.umask(int(spec["umask"], 8))

class ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("a", ctypes.c_uint64), ("b", ctypes.c_uint64)]

SCMP_ACT_ALLOW, SCMP_CMP_EQ, SCMP_CMP_GE = 0x7FFF0000, 4, 5
def errno_action(number):
    return 0x00050000 | number
seccomp = ctypes.CDLL("libseccomp.so.2", use_errno=True)
seccomp.seccomp_init.restype = ctypes.c_void_p
seccomp.seccomp_init.argtypes = [ctypes.c_uint32]
seccomp.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
seccomp.seccomp_rule_add_array.argtypes = [
    ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(ArgCmp)
]
seccomp.seccomp_load.argtypes = [ctypes.c_void_p]
ctx = seccomp.seccomp_init(errno_action(spec["errno"]))

def rule(action, number, *compare):
    array = (ArgCmp * max(1, len(compare)))(*compare)
    if seccomp.seccomp_rule_add_array(ctx, action, number, len(compare), array) != 0:
        sys.exit("seccomp_rule_add failed for syscall %d" % number)

families = spec["families"]
for name in spec["allow"]:
    number = seccomp.seccomp_syscall_resolve_name(name.encode())
    if number < 0:
        continue  # not a syscall of this architecture
    if name in ("socket", "socketpair"):
        for family in range(max(families) + 1):
            if family in families:
                rule(SCMP_ACT_ALLOW, number, ArgCmp(0, SCMP_CMP_EQ, family, 0))
            else:
                rule(errno_action(spec["eafnosupport"]), number, ArgCmp(0, SCMP_CMP_EQ, family, 0))
        rule(errno_action(spec["eafnosupport"]), number, ArgCmp(0, SCMP_CMP_GE, max(families) + 1, 0))
    else:
        rule(SCMP_ACT_ALLOW, number)
if seccomp.seccomp_load(ctx) != 0:
    sys.exit("seccomp_load failed")
os.execvp(sys.argv[2], sys.argv[2:])
"""


# --- What systemd reads -------------------------------------------------------------------------


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """section -> key -> every value assigned, in order (systemd lets keys repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"assignment outside a section: {raw!r}"
        assert not line.endswith("\\"), "line continuations are not handled by this parser"
        key, sep, value = line.partition("=")
        assert sep, f"not an assignment: {raw!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def parse_environment_file(text: str) -> dict[str, str]:
    """systemd's EnvironmentFile= format, the subset the shipped file may use: NAME=value lines,
    # or ; comments, optional surrounding quotes. Anything else fails rather than being misread."""
    env: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        match = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", line)
        assert match, f"not a NAME=value line: {raw!r}"
        name, value = match.groups()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        assert "\\" not in value and "$" not in value, f"escapes/expansions are not handled: {raw!r}"
        env[name] = value
    return env


def expand_exec_start(command: str, env: dict[str, str]) -> list[str]:
    """systemd's ExecStart= expansion: $NAME splits the value at whitespace, ${NAME} is one word."""
    assert command[:1] not in "-@:+!", f"ExecStart prefixes are not handled: {command!r}"
    argv: list[str] = []
    for word in command.split():
        whole = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if whole:
            argv.extend(env.get(whole.group(1), "").split())
            continue
        argv.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m.group(1), ""), word))
    return argv


def unit() -> dict[str, dict[str, list[str]]]:
    return parse_unit(UNIT.read_text(encoding="utf-8"))


def service_value(key: str) -> str:
    values = unit()["Service"].get(key)
    assert values, f"[Service] has no {key}="
    return values[-1]


def exec_start_path() -> Path:
    path = Path(service_value("ExecStart").split()[0])
    assert path.is_absolute() and path.parent.name == "bin", f"ExecStart should run <venv>/bin/...: {path}"
    return path


# --- A real install at the ExecStart path, visible only inside a private mount namespace ----------


def install_into(root: Path, runtime_wheels: Path, exporter_wheel: Path) -> None:
    """Installs <venv> of ExecStart under `root` as the unit's header says: `python3 -m venv
    /opt/amdgpu-exporter`, then pip install of the wheel built from this repo (its dependencies from the
    runtime lock). The install_root fixture (tests/integration/conftest.py) does it once per session for
    this module and test_systemd_debugfs_dropin.py, which only read it."""
    require_tool("python3", path=str(SYSTEM_PYTHON.parent))
    install_release(
        SYSTEM_PYTHON, root / exec_start_path().parent.parent.relative_to("/"), runtime_wheels, exporter_wheel
    )
    assert (root / exec_start_path().relative_to("/")).is_file()


def in_namespace(root: Path, argv: list[str]) -> list[str]:
    """argv run in a private mount namespace where the top folder of ExecStart (/opt) is root's."""
    top = "/" + exec_start_path().parts[1]
    unshare = require_tool("unshare")
    script = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
    return [unshare, "-m", "--propagation", "private", "sh", "-c", script, "sh", str(root / top[1:]), top, *argv]


def syscall_groups(systemd_analyze: str) -> dict[str, set[str]]:
    """systemd's @groups, each expanded to plain syscall names (groups nest)."""
    listing = subprocess.run(
        [systemd_analyze, "syscall-filter", "--no-pager"], capture_output=True, text=True, timeout=60
    ).stdout
    members: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in listing.splitlines():
        if line.startswith("@"):
            current = members.setdefault(line.strip(), [])
        elif line.startswith(" ") and current is not None and not line.strip().startswith("#"):
            current.append(line.strip())
        elif not line.strip():
            current = None

    def expand(name: str) -> set[str]:
        if not name.startswith("@"):
            return {name}
        assert name in members, f"systemd knows no syscall group {name}"
        return set().union(*(expand(item) for item in members[name]))

    return {name: expand(name) for name in members}


def seccomp_spec(systemd_analyze: str) -> dict[str, object]:
    """The unit's syscall and address-family filters as the allowed names and family numbers."""
    groups = syscall_groups(systemd_analyze)
    allowed: set[str] = set()
    values = unit()["Service"]["SystemCallFilter"]
    assert not values[0].startswith("~"), "this emulation handles an allow list, then removals"
    for value in values:
        names = set().union(*(groups[n] if n.startswith("@") else {n} for n in value.lstrip("~").split()))
        allowed = allowed - names if value.startswith("~") else allowed | names
    families = sorted(int(getattr(socket, name)) for name in service_value("RestrictAddressFamilies").split())
    return {
        "allow": sorted(allowed),
        "families": families,
        "errno": int(getattr(errno, service_value("SystemCallErrorNumber"))),
        "eafnosupport": errno.EAFNOSUPPORT,
        "umask": service_value("UMask"),
    }


# --- Tests ---------------------------------------------------------------------------------------


def test_unit_declares_the_sandbox_the_exporter_needs() -> None:
    service = unit()["Service"]

    def value(key: str) -> str:
        assert key in service, f"[Service] has no {key}="
        return service[key][-1]

    assert value("DynamicUser") == "yes" or value("User") not in ("", "root", "0")
    assert {"video", "render"} <= set(" ".join(service.get("SupplementaryGroups", [])).split())
    assert value("CapabilityBoundingSet") == ""
    assert value("AmbientCapabilities") == ""
    assert value("NoNewPrivileges") == "yes"
    assert value("MemoryDenyWriteExecute") == "yes"
    assert set(value("RestrictAddressFamilies").split()) == {"AF_INET", "AF_INET6", "AF_UNIX"}
    assert value("ProtectSystem") == "strict"
    assert value("ProtectKernelTunables") == "yes"
    assert value("Restart") == "on-failure"
    assert value("EnvironmentFile") == "-/etc/default/amdgpu-exporter"
    assert service.get("SystemCallFilter"), "no SystemCallFilter="
    # /sys must stay readable: nothing may hide it or make it inaccessible.
    for key in ("InaccessiblePaths", "TemporaryFileSystem"):
        assert "/sys" not in " ".join(service.get(key, [])).split()


def test_systemd_analyze_verify_passes(install_root: Path) -> None:
    systemd_analyze = require_tool("systemd-analyze")
    result = subprocess.run(
        in_namespace(install_root, [systemd_analyze, "verify", "--man=no", str(UNIT)]),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout + result.stderr == ""

    # The same check sees a broken copy: the tool is really judging the file.
    broken = install_root / "broken" / UNIT.name
    broken.parent.mkdir(exist_ok=True)
    broken.write_text(UNIT.read_text().replace("NoNewPrivileges=", "NoNewPrivilege="))
    result = subprocess.run(
        in_namespace(install_root, [systemd_analyze, "verify", "--man=no", str(broken)]),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "NoNewPrivilege" in result.stderr


def test_systemd_analyze_security_exposure_at_most_2() -> None:
    systemd_analyze = require_tool("systemd-analyze")
    result = subprocess.run(
        [systemd_analyze, "security", "--offline=true", "--no-pager", str(UNIT)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    match = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", result.stdout)
    assert match, result.stdout + result.stderr
    exposure = float(match.group(1))
    print(f"systemd-analyze security exposure of {UNIT.name}: {exposure}")
    assert exposure <= MAX_EXPOSURE, result.stdout
    # systemd's own threshold check (exposure x 10) agrees.
    threshold = subprocess.run(
        [systemd_analyze, "security", "--offline=true", f"--threshold={int(MAX_EXPOSURE * 10)}", str(UNIT)],
        capture_output=True,
        timeout=60,
    )
    assert threshold.returncode == 0


def test_environment_file_names_only_real_options(install_root: Path) -> None:
    """Every AMDGPU_EXPORTER_* the sample file mentions (set or commented out) is one the daemon reads."""
    executable = install_root / exec_start_path().relative_to("/")
    help_text = subprocess.run([executable, "--help"], capture_output=True, text=True, check=True, timeout=60).stdout
    known = set(re.findall(r"\benv\s+(AMDGPU_EXPORTER_[A-Z0-9_]+)", help_text))
    assert "AMDGPU_EXPORTER_WEB_LISTEN_ADDRESS" in known, help_text
    mentioned = set(re.findall(r"^#?(AMDGPU_EXPORTER_[A-Z0-9_]+)=", ENV_FILE.read_text(), re.MULTILINE))
    assert mentioned, "the sample env file documents no option"
    assert mentioned <= known, f"not options of the daemon: {sorted(mentioned - known)}"


def _drop_to(uid: int, gids: list[int]) -> list[str]:
    return [
        require_tool("setpriv"),
        f"--reuid={uid}",
        f"--regid={uid}",
        "--groups=" + ",".join(str(gid) for gid in gids) if gids else "--clear-groups",
        "--no-new-privs",
        "--bounding-set=-all",
        "--inh-caps=-all",
    ]


PROBE = """
import errno, mmap, os, socket
socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close()
try:
    socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
    raise SystemExit("AF_NETLINK allowed")
except OSError as error:
    assert error.errno == errno.EAFNOSUPPORT, error
try:
    os.setpriority(os.PRIO_PROCESS, 0, 5)  # @resources
    raise SystemExit("setpriority allowed")
except OSError as error:
    assert error.errno == errno.EPERM, error
try:
    mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    raise SystemExit("writable+executable memory allowed")
except OSError:
    pass
print("sandboxed", oct(os.umask(0)), os.getuid())
"""


def test_the_rebuilt_sandbox_enforces_the_units_filters() -> None:
    """The harness the ExecStart test relies on really refuses what the unit refuses."""
    spec = json.dumps(seccomp_spec(require_tool("systemd-analyze")))
    uid = _unused_dynamic_uid()
    result = subprocess.run(
        [*_drop_to(uid, []), str(SYSTEM_PYTHON), "-c", SANDBOX_EXEC, spec, str(SYSTEM_PYTHON), "-c", PROBE],
        capture_output=True,
        text=True,
        timeout=60,
        env=SYSTEMD_BASE_ENV,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split() == ["sandboxed", "0o" + service_value("UMask").lstrip("0"), str(uid)]


def _unused_dynamic_uid() -> int:
    for uid in DYNAMIC_UID_RANGE:
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
    raise AssertionError("no free uid in systemd's DynamicUser range")


def _status_fields(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _wait_for(url: str, process: subprocess.Popen[bytes], log: Path) -> tuple[int, bytes]:
    def answered() -> tuple[int, bytes] | None:
        status, body = _get(url)
        return (status, body) if status == 200 else None

    try:
        return wait_until(answered, f"{url} answering 200", process=process)
    except AssertionError as error:
        raise AssertionError(f"{error}:\n{log.read_text()}") from None


def test_exec_start_serves_as_the_unit_would_run_it(install_root: Path) -> None:
    port = free_port()
    # --demo comes in the way an operator would add a flag: through ARGS in the environment file.
    env_file = ENV_FILE.read_text(encoding="utf-8") + f"\nARGS=--demo --web.listen-address=127.0.0.1:{port}\n"
    environment = {**SYSTEMD_BASE_ENV, **parse_environment_file(env_file)}
    argv = expand_exec_start(service_value("ExecStart"), environment)
    assert argv[0] == str(exec_start_path())
    assert argv[1:] == ["--demo", f"--web.listen-address=127.0.0.1:{port}"]

    uid = _unused_dynamic_uid()
    groups = {}
    for name in service_value("SupplementaryGroups").split():
        try:
            groups[name] = grp.getgrnam(name).gr_gid
        except KeyError:
            print(f"group {name} does not exist on this host; running without it")
    assert groups, "none of the unit's SupplementaryGroups exists here"
    drop = _drop_to(uid, list(groups.values()))
    spec = json.dumps(seccomp_spec(require_tool("systemd-analyze")))
    command = [*drop, str(SYSTEM_PYTHON), "-c", SANDBOX_EXEC, spec, *argv]
    # A file, not a pipe: nobody reads the output while the test polls, and a full pipe would
    # block the daemon's logging.
    log_path = install_root / f"exporter-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            in_namespace(install_root, command), env=environment, stdout=log, stderr=subprocess.STDOUT, cwd="/"
        )
    try:
        _wait_for(f"http://127.0.0.1:{port}/healthz", process, log_path)
        # unshare, sh, the wrapper and setpriv all exec in place: this pid is the exporter.
        status = _status_fields(process.pid)
        assert status["Uid"].split() == [str(uid)] * 4
        assert set(status["Groups"].split()) == {str(gid) for gid in groups.values()}
        assert status["NoNewPrivs"] == "1"
        assert int(status["CapBnd"], 16) == 0 and int(status["CapEff"], 16) == 0
        assert status["Umask"] == service_value("UMask")
        assert status["Seccomp"] == "2", "the syscall filter is not in force"
        # The environment file's settings reached the daemon.
        environ = Path(f"/proc/{process.pid}/environ").read_bytes().split(b"\0")
        assert b"AMDGPU_EXPORTER_LOG_FORMAT=json" in environ

        _wait_for(f"http://127.0.0.1:{port}/readyz", process, log_path)
        metrics_status, metrics = _get(f"http://127.0.0.1:{port}/metrics")
        assert metrics_status == 200
        assert b"amdgpu_up{" in metrics
    finally:
        # systemd stops a service with SIGTERM and waits TimeoutStopSec= before SIGKILL.
        process.send_signal(signal.SIGTERM)
        stop_timeout = float(service_value("TimeoutStopSec").rstrip("s"))
        try:
            process.wait(timeout=stop_timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            pytest.fail(f"exporter ignored SIGTERM for {stop_timeout} s:\n{log_path.read_text(errors='replace')}")
    output = log_path.read_text(errors="replace")
    assert process.returncode in (0, -signal.SIGTERM), output
    # Logs are JSON lines, as AMDGPU_EXPORTER_LOG_FORMAT=json asks.
    log_events = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    assert log_events and all(isinstance(event, dict) for event in log_events), output
