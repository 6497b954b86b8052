"""TLS for the suite: certificates made at test time with openssl, and the TLS-only RedisServer."""

from __future__ import annotations

import atexit
import secrets
import shutil
import ssl
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.servers.process import AUTH_ERRORS, KEEP_DIRS, REDIS_CLI, RedisServer, child_env, output, quote, run_quietly

if TYPE_CHECKING:  # pragma: no cover - typing only
    import redis

__all__ = ["TLSFiles", "TLSRedisServer", "tls_files"]

OPENSSL = shutil.which("openssl") or "/usr/bin/openssl"


@dataclass(frozen=True)
class TLSFiles:
    """PEM files made at test time: a CA, a server cert (SAN IP:127.0.0.1, DNS:localhost),
    a client cert (for ``tls-auth-clients yes``) and a second, unrelated CA."""

    directory: Path
    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    wrong_ca_cert: Path
    wrong_ca_key: Path


_OPENSSL_CNF = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = distbrake-test
[v3_ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
[v3_server]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1,DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid,issuer
[v3_client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid,issuer
"""

_tls_files: TLSFiles | None = None
_tls_lock = threading.Lock()


def _openssl(*args: str, cwd: Path) -> None:
    result = run_quietly([OPENSSL, *args], timeout=30, cwd=cwd)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed ({result.returncode}):\n{output(result)}")


def _cleanup_tls_dir(path: Path) -> None:
    if not KEEP_DIRS:
        shutil.rmtree(path, ignore_errors=True)


def tls_files() -> TLSFiles:
    """Generate (once per process, EC P-256, 2-day validity) and return the TLS files."""
    global _tls_files
    with _tls_lock:
        if _tls_files is not None:
            return _tls_files
        if not Path(OPENSSL).exists():
            raise RuntimeError("the openssl CLI is needed to make test certificates")
        d = Path(tempfile.mkdtemp(prefix="distbrake-tls-"))
        atexit.register(_cleanup_tls_dir, d)
        (d / "openssl.cnf").write_text(_OPENSSL_CNF)
        newkey = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
        for ca in ("ca", "wrong-ca"):
            subject = f"/O=distbrake tests/CN=distbrake {ca} {secrets.token_hex(4)}"
            _openssl("req", "-x509", "-new", *newkey, "-keyout", f"{ca}.key", "-out", f"{ca}.crt", "-days", "2",
                     "-config", "openssl.cnf", "-extensions", "v3_ca", "-subj", subject, cwd=d)
        for leaf, cn in (("server", "localhost"), ("client", "distbrake-client")):
            _openssl("req", "-new", *newkey, "-keyout", f"{leaf}.key", "-out", f"{leaf}.csr",
                     "-config", "openssl.cnf", "-subj", f"/O=distbrake tests/CN={cn}", cwd=d)
            _openssl("x509", "-req", "-in", f"{leaf}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                     "-set_serial", f"0x{secrets.token_hex(8)}", "-days", "2", "-sha256",
                     "-extfile", "openssl.cnf", "-extensions", f"v3_{leaf}", "-out", f"{leaf}.crt", cwd=d)
        for key in d.glob("*.key"):
            key.chmod(0o600)
        pem = {f"{stem.replace('-', '_')}_{part}": d / f"{stem}.{ext}"
               for stem in ("ca", "server", "client", "wrong-ca") for part, ext in (("cert", "crt"), ("key", "key"))}
        _tls_files = TLSFiles(directory=d, **pem)
        return _tls_files


class TLSRedisServer(RedisServer):
    """A TLS-only node (``port 0``, ``tls-port N``); readiness is checked with
    ``redis-cli --tls --cacert``.  :attr:`port` is the TLS port."""

    kind = "redis-tls"

    def __init__(self, *, tls_auth_clients: bool = False, **kwargs: Any) -> None:
        """tls_auth_clients: require client certificates (use :attr:`client_cert_path`)."""
        self.tls = tls_files()
        self.tls_auth_clients = tls_auth_clients
        self.ca_path = str(self.tls.ca_cert)
        self.wrong_ca_path = str(self.tls.wrong_ca_cert)  # did not sign the server certificate: verification fails
        self.cert_path, self.key_path = str(self.tls.server_cert), str(self.tls.server_key)
        self.client_cert_path, self.client_key_path = str(self.tls.client_cert), str(self.tls.client_key)
        super().__init__(**kwargs)

    @property
    def url(self) -> str:
        """``rediss://127.0.0.1:N``."""
        return f"rediss://{self.host}:{self.port}"

    def _listen_lines(self) -> list[str]:
        return [
            "port 0",
            f"tls-port {self.port}",
            f"tls-cert-file {quote(self.cert_path)}",
            f"tls-key-file {quote(self.key_path)}",
            f"tls-ca-cert-file {quote(self.ca_path)}",
            f"tls-auth-clients {'yes' if self.tls_auth_clients else 'no'}",
        ]

    def ssl_context(
        self, *, cafile: str | None = None, client_cert: bool | None = None
    ) -> ssl.SSLContext:
        """A verifying client context (CA: ours unless ``cafile``), plus client cert if needed."""
        ctx = ssl.create_default_context(cafile=cafile or self.ca_path)
        if client_cert if client_cert is not None else self.tls_auth_clients:
            ctx.load_cert_chain(self.client_cert_path, self.client_key_path)
        return ctx

    def probe(self) -> tuple[bool, str]:
        cmd = [REDIS_CLI, "--tls", "--cacert", self.ca_path, "-h", self.host, "-p", str(self.port)]
        if self.tls_auth_clients:
            cmd += ["--cert", self.client_cert_path, "--key", self.client_key_path]
        if self.password is not None:
            cmd += ["--no-auth-warning", "-a", self.password]
        cmd.append("PING")
        try:
            result = run_quietly(cmd, timeout=5, env=child_env())
        except subprocess.TimeoutExpired as exc:
            return False, repr(exc)
        out = output(result).strip()
        if result.returncode == 0 and (out == "PONG" or out.startswith(AUTH_ERRORS)):
            return True, out
        return False, out

    def _credentials(self) -> dict[str, Any]:
        return {**super()._credentials(), "ssl_context": self.ssl_context()}

    def client(self, **kwargs: Any) -> redis.Redis:
        """redis-py client over TLS verifying against :attr:`ca_path`."""
        options: dict[str, Any] = {"ssl": True, "ssl_ca_certs": self.ca_path}
        if self.tls_auth_clients:
            options.update(ssl_certfile=self.client_cert_path, ssl_keyfile=self.client_key_path)
        options.update(kwargs)
        return super().client(**options)
