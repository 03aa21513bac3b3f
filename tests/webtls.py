"""Test PKI made with the openssl CLI: a CA, a server certificate for 127.0.0.1/localhost, client
certificates, and a web configuration file writer. bcrypt hashes for basic_auth_users."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import yaml

from tests.realtools import require_tool


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run([require_tool("openssl"), *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@dataclass(frozen=True)
class Pki:
    folder: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_cert: Path  # signed by the CA, SAN "intruder.example"
    other_key: Path
    rogue_cert: Path  # self-signed, not from the CA
    rogue_key: Path


def _leaf(folder: Path, name: str, subject: str, san: str, usage: str) -> None:
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=folder,
    )  # fmt: skip
    (folder / f"{name}.ext").write_text(f"subjectAltName={san}\nextendedKeyUsage={usage}\n")
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=folder,
    )  # fmt: skip


def server_certificate(folder: Path, name: str, dns_name: str) -> tuple[Path, Path]:
    """Another server certificate and key from make_pki's CA (in `folder`), for the name `dns_name`."""
    _leaf(folder, name, f"/CN={dns_name}", f"DNS:{dns_name}", "serverAuth")
    return folder / f"{name}.crt", folder / f"{name}.key"


def make_pki(folder: Path) -> Pki:
    folder.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=amdgpu-exporter test CA", cwd=folder,
    )  # fmt: skip
    _leaf(folder, "server", "/CN=localhost", "DNS:localhost,IP:127.0.0.1,IP:::1", "serverAuth")
    _leaf(folder, "client", "/CN=prometheus", "DNS:prometheus.example", "clientAuth")
    _leaf(folder, "other", "/CN=intruder", "DNS:intruder.example", "clientAuth")
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "rogue.key", "-out", "rogue.crt", "-days", "2", "-subj", "/CN=rogue",
        "-addext", "subjectAltName=DNS:prometheus.example", cwd=folder,
    )  # fmt: skip
    return Pki(
        folder,
        folder / "ca.crt",
        folder / "server.crt",
        folder / "server.key",
        folder / "client.crt",
        folder / "client.key",
        folder / "other.crt",
        folder / "other.key",
        folder / "rogue.crt",
        folder / "rogue.key",
    )


def bcrypt_hash(password: str, rounds: int = 10) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=rounds)).decode()


def write_web_config(path: Path, config: dict) -> Path:
    """Atomically (rename), as a configuration manager would."""
    temp = path.with_name(path.name + ".tmp")
    temp.write_text(yaml.safe_dump(config, sort_keys=False))
    temp.replace(path)
    return path
