"""TLSServerConfig -> ssl.SSLContext, with one clear sentence for every way the files can be wrong.

The files are read here, once per (re)load: a certificate rotated on disk reaches new
connections through the reloader (webconfig_reload.py), never by re-reading per handshake.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import tempfile
from collections.abc import Iterator

from exporter.web.webconfig import TLSServerConfig, WebConfigError

_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# What each client_auth_type becomes in OpenSSL's terms. Python's ssl always verifies a client
# certificate it asks for, so RequestClientCert only asks when a client CA is given and
# RequireAnyClientCert (accepted only with a client CA, see webconfig.py) verifies: both are
# stricter than Go, never looser.
_VERIFY_MODES = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_OPTIONAL,
    "RequireAnyClientCert": ssl.CERT_REQUIRED,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}


class _EncryptedKey(Exception):
    pass


def _refuse_password() -> str:
    raise _EncryptedKey


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as error:
        raise WebConfigError(f"cannot read {what} {path}: {error.strerror or error}") from None


@contextlib.contextmanager
def _pem_files(tls: TLSServerConfig) -> Iterator[tuple[str, str]]:
    """Paths of the certificate and key; inline PEM goes through a private temporary folder."""
    if not (tls.cert or tls.key):
        yield tls.cert_file, tls.key_file
        return
    with tempfile.TemporaryDirectory(prefix="amdgpu-exporter-tls-") as folder:
        paths = []
        for name, inline, path in (("cert.pem", tls.cert, tls.cert_file), ("key.pem", tls.key, tls.key_file)):
            if inline:
                path = os.path.join(folder, name)
                descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(descriptor, "w", encoding="ascii", errors="replace") as handle:
                    handle.write(inline)
            paths.append(path)
        yield paths[0], paths[1]


def _names(tls: TLSServerConfig) -> tuple[str, str]:
    return (tls.cert_file or "the inline cert", tls.key_file or "the inline key")


def build_ssl_context(tls: TLSServerConfig) -> ssl.SSLContext:
    """A server context for tls; WebConfigError (one sentence, no secret) when it cannot be built."""
    cert_name, key_name = _names(tls)
    if tls.cert_file:
        cert_bytes = _read(tls.cert_file, "cert_file")
        if b"-----BEGIN CERTIFICATE-----" not in cert_bytes:
            raise WebConfigError(f"cert_file {tls.cert_file} holds no PEM certificate")
    if tls.key_file:
        key_bytes = _read(tls.key_file, "key_file")
        if b"PRIVATE KEY-----" not in key_bytes:
            raise WebConfigError(f"key_file {tls.key_file} holds no PEM private key")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE | ssl.OP_NO_COMPRESSION
    try:
        context.minimum_version = _VERSIONS[tls.min_version]
        if tls.max_version:
            context.maximum_version = _VERSIONS[tls.max_version]
    except (ValueError, ssl.SSLError) as error:
        raise WebConfigError(f"tls_server_config: this OpenSSL refuses the TLS versions asked for ({error})") from None
    with _pem_files(tls) as (cert_path, key_path):
        try:
            context.load_cert_chain(cert_path, key_path, password=_refuse_password)
        except _EncryptedKey:
            raise WebConfigError(f"{key_name} is encrypted; give an unencrypted key") from None
        except ssl.SSLError as error:
            if "KEY_VALUES_MISMATCH" in str(error) or "key values mismatch" in str(error):
                raise WebConfigError(f"{cert_name} does not match {key_name}") from None
            raise WebConfigError(f"cannot load {cert_name} with {key_name}: {error.reason or error}") from None
        except OSError as error:
            raise WebConfigError(f"cannot read {cert_name} or {key_name}: {error.strerror or error}") from None
    if tls.client_ca_file:
        ca_bytes = _read(tls.client_ca_file, "client_ca_file")
        if b"-----BEGIN CERTIFICATE-----" not in ca_bytes:
            raise WebConfigError(f"client_ca_file {tls.client_ca_file} holds no PEM certificate")
        try:
            context.load_verify_locations(cadata=ca_bytes.decode("ascii", errors="replace"))
        except ssl.SSLError as error:
            raise WebConfigError(f"client_ca_file {tls.client_ca_file}: {error.reason or error}") from None
        context.verify_mode = _VERIFY_MODES[tls.client_auth_type]
    else:
        context.verify_mode = ssl.CERT_NONE
    if tls.cipher_suites:
        try:
            context.set_ciphers(":".join(tls.cipher_suites))
        except ssl.SSLError:
            raise WebConfigError("tls_server_config.cipher_suites: this OpenSSL supports none of them") from None
    if tls.curve:
        try:
            context.set_ecdh_curve(tls.curve)
        except (ValueError, ssl.SSLError):
            raise WebConfigError(f"tls_server_config.curve_preferences: this OpenSSL lacks {tls.curve}") from None
    return context


def peer_sans(peercert: object) -> set[str]:
    """The subject alternative names of a verified peer certificate (DNS, IP, e-mail, URI)."""
    if not isinstance(peercert, dict):
        return set()
    return {str(value) for _kind, value in peercert.get("subjectAltName", ())}


def san_allowed(tls: TLSServerConfig, peercert: object) -> bool:
    """client_allowed_sans: with a list, a verified client certificate must carry one of its names."""
    if not tls.client_allowed_sans:
        return True
    return bool(peer_sans(peercert) & set(tls.client_allowed_sans))
