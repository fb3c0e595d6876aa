"""The emulator's private certificate authority and the certificate it issues for Google's storage hosts.

TensorFlow's Cloud Storage filesystem (and the bootstrap, the prefetch) talk HTTPS to
``storage.googleapis.com`` and ``www.googleapis.com`` and nowhere else, so the HTTPS front before
fake-gcs-server (``front``) must present a certificate for those names that the node's clients
trust. ``ensure_authority`` creates, once per state directory, a CA and a server certificate signed by it:

    <state-dir>/tls/ca.pem          the CA certificate (public)
    <state-dir>/tls/ca.key          the CA key, mode 0600, read by nobody but this module
    <state-dir>/tls/server.pem      certificate for the storage hosts
    <state-dir>/tls/server.key      its key, mode 0600 (the HTTPS front, ``gcs.front.GcsFront``, reads it)
    <state-dir>/tls/ca-bundle.pem   the system's trusted CAs plus ours: what CURL_CA_BUNDLE,
                                    SSL_CERT_FILE and REQUESTS_CA_BUNDLE point at on a node, so
                                    pip still reaches PyPI while the storage hosts are ours

Invariants: keys are created with mode 0600 from the first byte (``os.open`` with the mode, never
chmod afterwards) and never leave the directory; the CA is reused across restarts of one state
directory (a node that kept the bundle keeps trusting it), and so is the server certificate.
Nothing here is secret except the two ``.key`` files.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

STORAGE_HOSTS = ("storage.googleapis.com", "www.googleapis.com")
SYSTEM_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem")
_VALID = datetime.timedelta(days=825)


@dataclass(frozen=True)
class Authority:
    """Where the TLS material of one emulator is (``authority_in``)."""

    directory: Path
    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    bundle: Path


def authority_in(directory: Path) -> Authority:
    names = ("ca.pem", "ca.key", "server.pem", "server.key", "ca-bundle.pem")
    return Authority(directory, *(directory / name for name in names))


def _write_private(path: Path, data: bytes) -> None:
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _create_ca(authority: Authority) -> None:
    key = _new_key()
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("tpuops emulator CA"))
        .issuer_name(_name("tpuops emulator CA"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALID)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                          key_encipherment=False, data_encipherment=False, key_agreement=False,
                          encipher_only=False, decipher_only=False),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_private(authority.ca_key, _key_pem(key))
    authority.ca_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _issue_server(authority: Authority) -> None:
    ca_key = serialization.load_pem_private_key(authority.ca_key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{authority.ca_key} is not the EC key this module writes")
    ca_cert = x509.load_pem_x509_certificate(authority.ca_cert.read_bytes())
    key = _new_key()
    now = datetime.datetime.now(datetime.timezone.utc)
    names: list[x509.GeneralName] = [x509.DNSName(host) for host in STORAGE_HOSTS]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(STORAGE_HOSTS[0]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALID)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write_private(authority.server_key, _key_pem(key))
    authority.server_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _write_bundle(authority: Authority) -> None:
    system = next((Path(path) for path in SYSTEM_BUNDLES if Path(path).is_file()), None)
    parts = [system.read_bytes()] if system is not None else []
    parts.append(authority.ca_cert.read_bytes())
    tmp = authority.bundle.with_suffix(".tmp")
    tmp.write_bytes(b"\n".join(parts))
    tmp.replace(authority.bundle)


def ensure_authority(state_dir: Path) -> Authority:
    """The CA of ``state_dir`` and its certificate for the storage hosts, both created once."""
    authority = authority_in(Path(state_dir) / "tls")
    authority.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not (authority.ca_key.is_file() and authority.ca_cert.is_file()):
        _create_ca(authority)
        authority.server_cert.unlink(missing_ok=True)
    if not (authority.server_key.is_file() and authority.server_cert.is_file()):
        _issue_server(authority)
    _write_bundle(authority)
    return authority
