"""Issue 31 case 11: the .deb's maintainer scripts on a fresh trixie node (the chroot and the package of
test_deb_package.py, its fixtures reused): idempotent, a purge never fails, only what the package made
is removed: an admin's own account of that name and an admin's files under /opt/amdgpu-exporter stay."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from deploy.deb.build import PREFIX
from tests.integration import test_deb_package as packaged
from tests.integration.test_deb_package import Node
from tests.realtools import stop

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

# the package and the fresh node of test_deb_package.py (built from the cache; a node of this module's own)
built, deb, node = packaged.built, packaged.deb, packaged.node

MARK = "/var/lib/amdgpu-exporter/account-created-by-package"


def groups_of(node: Node, user: str) -> set[str]:
    return set(node.run("id", "-nG", user).stdout.split())


def reinstall(node: Node) -> None:
    debs = node.run("sh", "-c", "ls /srv/test/*.deb").stdout.split()
    node.run("apt-get", "install", "-y", "-qq", "--no-install-recommends", debs[0])


def start_over(node: Node) -> None:
    """No package, no account, no state: each test starts as a fresh node, whatever the last one left."""
    node.run("dpkg", "--purge", "amdgpu-exporter", check=False)
    node.run("userdel", "--remove", "amdgpu-exporter", check=False)
    node.run("groupdel", "amdgpu-exporter", check=False)
    node.run("rm", "-rf", "/var/lib/amdgpu-exporter", PREFIX)


def test_configure_again_keeps_what_the_admin_changed(node: Node) -> None:
    start_over(node)
    reinstall(node)
    assert {"video", "render"} <= groups_of(node, "amdgpu-exporter")
    node.run("gpasswd", "--delete", "amdgpu-exporter", "render")
    node.run("dpkg-reconfigure", "amdgpu-exporter")
    node.run("/var/lib/dpkg/info/amdgpu-exporter.postinst", "configure", "0.0.1")
    assert "render" not in groups_of(node, "amdgpu-exporter"), "configure put the account back into render"
    assert node.run("test", "-f", MARK, check=False).returncode == 0


def test_remove_keeps_the_admins_files(node: Node) -> None:
    start_over(node)
    reinstall(node)
    node.run("sh", "-c", f"mkdir -p {PREFIX}/etc && echo 'tls_server_config: {{}}' > {PREFIX}/etc/web.yml")
    node.run(f"{PREFIX}/bin/python", "-c", "import exporter.cli")  # byte code dpkg does not know
    node.run("apt-get", "remove", "-y", "-qq", "amdgpu-exporter")
    assert node.run("cat", f"{PREFIX}/etc/web.yml").stdout == "tls_server_config: {}\n"
    left = node.run("find", PREFIX).stdout.split()
    assert sorted(left) == [PREFIX, f"{PREFIX}/etc", f"{PREFIX}/etc/web.yml"], left
    node.run("dpkg", "--purge", "amdgpu-exporter")
    assert node.run("cat", f"{PREFIX}/etc/web.yml").returncode == 0


def test_a_purge_survives_a_process_of_the_account_and_a_second_purge_finishes(node: Node) -> None:
    start_over(node)
    reinstall(node)
    node.run("apt-get", "remove", "-y", "-qq", "amdgpu-exporter")
    # a process still running as the account: userdel refuses, the purge must not fail
    sleeper = subprocess.Popen(
        node.argv("setpriv", "--reuid=amdgpu-exporter", "--regid=amdgpu-exporter", "--clear-groups", "sleep", "300"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # nsenter, chroot, env and setpriv each exec the next: the Popen's pid is the sleep's own
        deadline = time.monotonic() + 10
        while Path(f"/proc/{sleeper.pid}/comm").read_text().strip() != "sleep":
            assert time.monotonic() < deadline and sleeper.poll() is None, "the account's process did not start"
            time.sleep(0.05)
        purge = node.run("dpkg", "--purge", "amdgpu-exporter", check=False)
        assert purge.returncode == 0, purge.stdout + purge.stderr
        assert "could not remove the account amdgpu-exporter" in purge.stderr
        assert node.run("getent", "passwd", "amdgpu-exporter", check=False).returncode == 0
    finally:
        stop(sleeper)
    # the account is still the package's: a purge once nothing runs as it removes it, twice is fine
    reinstall(node)
    node.run("dpkg", "--purge", "amdgpu-exporter")
    assert node.run("getent", "passwd", "amdgpu-exporter", check=False).returncode == 2
    assert node.run("getent", "group", "amdgpu-exporter", check=False).returncode == 2
    assert node.run("test", "-e", MARK, check=False).returncode == 1


def test_an_admins_own_account_of_that_name_is_used_and_never_removed(node: Node) -> None:
    start_over(node)
    node.run("useradd", "--create-home", "--shell", "/bin/bash", "amdgpu-exporter")
    before = node.run("getent", "passwd", "amdgpu-exporter").stdout
    groups = groups_of(node, "amdgpu-exporter")
    reinstall(node)
    assert groups_of(node, "amdgpu-exporter") == groups, "the admin's account was put into groups"
    assert node.run("test", "-e", MARK, check=False).returncode == 1
    purge = node.run("dpkg", "--purge", "amdgpu-exporter", check=False)
    assert purge.returncode == 0, purge.stderr
    assert node.run("getent", "passwd", "amdgpu-exporter").stdout == before
    assert node.run("test", "-d", "/home/amdgpu-exporter").returncode == 0
    node.run("userdel", "--remove", "amdgpu-exporter")
