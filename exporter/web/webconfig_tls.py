"""TLSServerConfig -> ssl.SSLContext, with one clear sentence for every way the files can be wrong.

The files are read here, once per (re)load: a certificate rotated on disk reaches new
connections through the reloader (webconfig_reload.py), never by re-reading per handshake.
"""

from __future__ import annotations

import contextlib
import os
import ssl
from collections.abc import Iterator

from exporter import boundedfile
from exporter.web.webconfig import TLS_VERSIONS, VERIFY_MODES, TLSServerConfig, WebConfigError

MAX_PEM_BYTES = 1 << 20  # a long chain is tens of KiB


class _EncryptedKey(Exception):
    pass


def _refuse_password() -> str:
    raise _EncryptedKey


def _read(path: str, what: str) -> bytes:
    try:
        return boundedfile.read_bytes(path, what, MAX_PEM_BYTES)
    except boundedfile.FileReadError as error:
        raise WebConfigError(str(error)) from None


@contextlib.contextmanager
def _in_memory(*contents: bytes) -> Iterator[list[str]]:
    """Paths that read back `contents` from memory (memfd). OpenSSL loads a key pair only from paths;
    handing it the bytes already read and checked means a file swapped on disk between the check
    and the load cannot be loaded half-old, and an inline key never touches a disk that may be full."""
    descriptors: list[int] = []
    try:
        for content in contents:
            descriptors.append(os.memfd_create("amdgpu-exporter-tls", os.MFD_CLOEXEC))
            view = memoryview(content)
            while view:
                view = view[os.write(descriptors[-1], view) :]
    except OSError as error:
        for descriptor in descriptors:
            os.close(descriptor)
        raise WebConfigError(f"cannot hold the certificate and key in memory: {error.strerror or error}") from None
    try:
        yield [f"/proc/self/fd/{descriptor}" for descriptor in descriptors]
    finally:
        for descriptor in descriptors:
            os.close(descriptor)


def build_ssl_context(tls: TLSServerConfig) -> ssl.SSLContext:
    """A server context for tls; WebConfigError (one sentence, no secret) when it cannot be built."""
    cert_name, key_name = tls.cert_file or "the inline cert", tls.key_file or "the inline key"
    cert_bytes = tls.cert.encode("utf-8", "replace") if tls.cert else _read(tls.cert_file, "cert_file")
    if b"-----BEGIN CERTIFICATE-----" not in cert_bytes:
        raise WebConfigError(f"{cert_name} holds no PEM certificate")
    key_bytes = tls.key.encode("utf-8", "replace") if tls.key else _read(tls.key_file, "key_file")
    if b"PRIVATE KEY-----" not in key_bytes:
        raise WebConfigError(f"{key_name} holds no PEM private key")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE | ssl.OP_NO_COMPRESSION
    try:
        context.minimum_version = TLS_VERSIONS[tls.min_version]
        if tls.max_version:
            context.maximum_version = TLS_VERSIONS[tls.max_version]
    except (ValueError, ssl.SSLError) as error:
        raise WebConfigError(f"tls_server_config: this OpenSSL refuses the TLS versions asked for ({error})") from None
    with _in_memory(cert_bytes, key_bytes) as (cert_path, key_path):
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
        context.verify_mode = VERIFY_MODES[tls.client_auth_type]
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


def san_allowed(tls: TLSServerConfig, peercert: object) -> bool:
    """client_allowed_sans: with a list, a verified client certificate must carry one of its names
    among its subject alternative names (DNS, IP, e-mail, URI)."""
    if not tls.client_allowed_sans:
        return True
    if not isinstance(peercert, dict):
        return False
    return any(str(value) in tls.client_allowed_sans for _kind, value in peercert.get("subjectAltName", ()))
