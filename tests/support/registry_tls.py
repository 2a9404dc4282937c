"""A throwaway certificate authority for tests: a self-signed CA and a server certificate for
127.0.0.1 it signs, made with the `openssl` command line."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

DAYS = "2"


@dataclass(frozen=True)
class CertificateFiles:
    """Paths of the CA certificate and the server's certificate and key (PEM)."""

    ca_cert: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_certificates(directory: Path) -> CertificateFiles:
    """A new CA in `directory`, a server certificate (SAN IP:127.0.0.1, DNS:localhost) and a client
    certificate it signs."""
    ca_key, ca_cert = directory / "ca.key", directory / "ca.pem"
    key, csr, cert, ext = (directory / name for name in ("server.key", "server.csr", "server.pem", "san.ext"))
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca_cert),
             "-days", DAYS, "-subj", "/CN=cdc-lakehouse test CA")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", "/CN=127.0.0.1")
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca_cert), "-CAkey", str(ca_key), "-CAcreateserial",
             "-out", str(cert), "-days", DAYS, "-extfile", str(ext))
    client_key, client_csr, client_cert = (directory / name for name in ("client.key", "client.csr", "client.pem"))
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(client_key), "-out", str(client_csr),
             "-subj", "/CN=cdc-lakehouse")
    _openssl("x509", "-req", "-in", str(client_csr), "-CA", str(ca_cert), "-CAkey", str(ca_key), "-CAcreateserial",
             "-out", str(client_cert), "-days", DAYS)
    return CertificateFiles(str(ca_cert), str(cert), str(key), str(client_cert), str(client_key))
