"""A lab CA on the controller, for a gateway that should speak TLS where nobody runs a PKI.

`qwen27b_gateway_tls_lab_ca: DIR` asks for it: DIR holds the CA (made once: ca.crt, ca.key 0600)
and, per gateway, the certificate it signed for the gateway's address (GATEWAY.crt, GATEWAY.key
0600; the inventory name with characters other than letters, digits, `._-` as `_`). Clients trust DIR/ca.crt (the plan says how). A second run reuses both, so nothing on the
gateway changes; a certificate is issued again only when the gateway's address changed, it was
signed by another CA or it ends within RENEW_BEFORE.

Why hand code: the deploy must make a CA and a server certificate without a PKI service or a
shell command that would see the key. `cryptography` (pyca, already paramiko's dependency) does
the crypto; this module only names the files, keeps them stable and their keys 0600.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
CERT_DAYS = 397  # the longest a client (browsers, Apple's TLS) accepts for a server certificate
RENEW_BEFORE = datetime.timedelta(days=30)
CA_NAME = "qwen27b lab CA"


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write_private(path: Path, data: bytes) -> None:
    """Write a private key 0600 from its first byte (never readable by others, not even briefly)."""
    part = path.with_name(path.name + ".part")
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(part, path)


def _write_public(path: Path, data: bytes) -> None:
    part = path.with_name(path.name + ".part")
    part.write_bytes(data)
    os.replace(part, path)


def _load_key(path: Path):
    if path.stat().st_mode & 0o077:
        raise PermissionError(f"{path} is readable by others: chmod 600 {path} (a lab CA's key signs any name)")
    return serialization.load_pem_private_key(path.read_bytes(), password=None)


def ensure_ca(directory: str | Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """The lab CA in `directory` (made 0700 with its key 0600 when absent); reused when present."""
    root = Path(directory)
    cert_path, key_path = root / "ca.crt", root / "ca.key"
    if cert_path.exists() and key_path.exists():
        return x509.load_pem_x509_certificate(cert_path.read_bytes()), _load_key(key_path)
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME)])
    now = _now()
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    _write_private(key_path, _key_pem(key))
    _write_public(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    return cert, key


def _names(cert: x509.Certificate) -> set[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} | set(san.get_values_for_type(x509.DNSName))


def _still_good(cert: x509.Certificate, ca: x509.Certificate, addresses: set[str]) -> bool:
    return (cert.issuer == ca.subject and _names(cert) == addresses
            and cert.not_valid_after_utc - _now() > RENEW_BEFORE
            and cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value.key_identifier
            == ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest)


def gateway_cert(directory: str | Path, gateway: str, addresses: list[str]) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) for the gateway `gateway` at `addresses` (IP addresses), signed by
    the lab CA of `directory`; the kept pair when it still fits, else a new one (kept for next time)."""
    ca_cert, ca_key = ensure_ca(directory)
    root = Path(directory)
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", gateway).lstrip(".") or "gateway"  # an inventory name: @fake/gw, ssh://...
    cert_path, key_path = root / f"{stem}.crt", root / f"{stem}.key"
    wanted = {str(ipaddress.ip_address(a)) for a in addresses}
    if cert_path.exists() and key_path.exists():
        kept = x509.load_pem_x509_certificate(cert_path.read_bytes())
        _load_key(key_path)  # its mode checked
        if _still_good(kept, ca_cert, wanted):
            return cert_path.read_bytes(), key_path.read_bytes()
    key = _new_key()
    now = _now()
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"qwen27b gateway {gateway}")]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(a)) for a in sorted(wanted)]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    cert_pem, key_pem = cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)
    _write_private(key_path, key_pem)
    _write_public(cert_path, cert_pem)
    return cert_pem, key_pem
