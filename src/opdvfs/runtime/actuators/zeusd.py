"""NVIDIA GPUs without root: clocks set through Zeus's privileged daemon, ``zeusd``.

Locking an SM clock needs root or CAP_SYS_ADMIN; clusters rarely grant either to a training job.
``zeusd`` (ml-energy/zeus, ``docs/zeusd/api.md``) runs privileged and takes the writes over HTTP on
a Unix socket (``ZEUSD_SOCK_PATH``) or TCP (``ZEUSD_HOST_PORT``), with an optional bearer token
(``ZEUSD_TOKEN``). :class:`ZeusdActuator` sends only the two writes it needs there:

* ``POST /gpu/set_gpu_locked_clocks?gpu_ids=I&min_clock_mhz=F&max_clock_mhz=F&block=true``
* ``POST /gpu/reset_gpu_locked_clocks?gpu_ids=I&block=true``

and reads everything else (supported clocks, power, the energy counter) through NVML, which needs
no privilege. ``block=true`` makes the daemon answer after NVML has applied the clock, so a
failure (no permission, unsupported clock) comes back to the caller as an opdvfs error. The
client is the standard library's :mod:`http.client`: two requests do not justify a dependency.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
from urllib.parse import urlencode

from opdvfs.exceptions import (
    ActuatorError,
    DeviceNotFoundError,
    NotSupportedError,
    PermissionDeniedError,
    ValidationError,
)
from opdvfs.runtime.actuators.nvml import NvmlActuator
from opdvfs.runtime.gpu_select import GpuChoice

__all__ = ["ZeusdActuator", "ZeusdClient"]

#: How long one request may take (s). A blocking clock write is one NVML call (10-20 ms).
TIMEOUT_S = 5.0

_NO_DAEMON = (
    "zeusd: set ZEUSD_SOCK_PATH (its Unix socket) or ZEUSD_HOST_PORT (host:port) to reach the "
    "Zeus daemon, or run as root with --actuator nvml"
)


class _UnixConnection(http.client.HTTPConnection):
    """An HTTP connection over a Unix domain socket (zeusd's default transport)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class ZeusdClient:
    """The two clock writes of zeusd's GPU API, over its Unix socket or TCP.

    Parameters
    ----------
    socket_path
        The daemon's Unix socket; default ``ZEUSD_SOCK_PATH``.
    host_port
        ``host:port`` of a daemon listening on TCP, used when no socket is given; default
        ``ZEUSD_HOST_PORT``.
    token
        Bearer token for a daemon started with authentication; default ``ZEUSD_TOKEN``.

    Raises
    ------
    DeviceNotFoundError
        When neither a socket nor a TCP address is given or set in the environment.
    """

    def __init__(
        self,
        socket_path: str | os.PathLike[str] | None = None,
        host_port: str | None = None,
        token: str | None = None,
    ) -> None:
        env = os.environ
        sock = socket_path if socket_path is not None else env.get("ZEUSD_SOCK_PATH")
        self.socket_path = os.fspath(sock) if sock else None
        self.host_port = None if self.socket_path else host_port or env.get("ZEUSD_HOST_PORT")
        if self.socket_path is None and not self.host_port:
            raise DeviceNotFoundError(_NO_DAEMON)
        if self.socket_path is None:
            port = str(self.host_port).rpartition(":")[2]
            if not port.isdigit() or not 0 < int(port) < 65536:
                raise ValidationError(
                    f"ZEUSD_HOST_PORT={self.host_port!r}: expected host:port with a port "
                    "number 1-65535 (or ZEUSD_SOCK_PATH, the daemon's Unix socket)",
                    field="ZEUSD_HOST_PORT",
                )
        self.token = token if token is not None else env.get("ZEUSD_TOKEN")

    @property
    def address(self) -> str:
        """Where the daemon is reached, for messages."""
        return self.socket_path or f"http://{self.host_port}"

    def _connection(self) -> http.client.HTTPConnection:
        if self.socket_path is not None:
            return _UnixConnection(self.socket_path, TIMEOUT_S)
        host, _, port = str(self.host_port).rpartition(":")
        return http.client.HTTPConnection(host or "localhost", int(port), timeout=TIMEOUT_S)

    def reachable(self) -> None:
        """Connect to the daemon and hang up (nothing asked of it).

        Raises
        ------
        DeviceNotFoundError
            When the daemon cannot be reached.
        """
        conn = self._connection()
        try:
            conn.connect()
        except OSError as exc:
            raise DeviceNotFoundError(f"zeusd at {self.address} cannot be reached ({exc})") from exc
        finally:
            conn.close()

    def post(self, path: str, **params: object) -> None:
        """POST ``path`` with ``params`` as the query string; raise on any non-200 answer.

        Raises
        ------
        DeviceNotFoundError
            When the daemon cannot be reached.
        PermissionDeniedError
            On 401/403 (a missing or insufficient token, or NVML's NO_PERMISSION in the daemon).
        NotSupportedError
            On 400 (a clock or operation the GPU does not take).
        ActuatorError
            On any other failure of the daemon.
        """
        query = urlencode(
            {k: str(v).lower() if isinstance(v, bool) else v for k, v in params.items()}
        )
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        conn = self._connection()
        try:
            conn.request("POST", f"{path}?{query}", headers=headers)
            response = conn.getresponse()
            status, body = response.status, response.read().decode(errors="replace")
        except (OSError, http.client.HTTPException) as exc:
            raise DeviceNotFoundError(f"zeusd at {self.address} cannot be reached ({exc})") from exc
        finally:
            conn.close()
        if status == 200:
            return
        raise _error(status, f"zeusd refused {path} ({status}: {_reason(body)})")


def _reason(body: str) -> str:
    """Return the daemon's message: per-GPU ``{"errors": {id: msg}}``, else the body."""
    try:
        doc = json.loads(body)
    except ValueError:
        return body.strip() or "no message"
    if isinstance(doc, dict) and isinstance(doc.get("errors"), dict):
        return "; ".join(f"GPU {k}: {v}" for k, v in doc["errors"].items())
    return body.strip()


def _error(status: int, message: str) -> ActuatorError:
    if status in (401, 403):
        return PermissionDeniedError(message)
    if status in (400, 404):
        return NotSupportedError(message)
    return ActuatorError(message)


class ZeusdActuator(NvmlActuator):
    """Core (SM) clock control of one NVIDIA GPU through ``zeusd``, without root.

    Reads (supported clocks, power, the energy counter) go through NVML as in
    :class:`~opdvfs.runtime.actuators.nvml.NvmlActuator`; the clock writes go to the daemon.

    Parameters
    ----------
    index, gpu
        The GPU, as :class:`~opdvfs.runtime.actuators.nvml.NvmlDevice`: default this process's
        own (:func:`~opdvfs.runtime.actuators.nvml.current_gpu`); its NVML index is the
        daemon's ``gpu_ids`` (zeusd numbers GPUs as NVML does).
    client
        The daemon's client; default one from ``ZEUSD_SOCK_PATH`` / ``ZEUSD_HOST_PORT``.

    Raises
    ------
    DeviceNotFoundError
        Without a daemon address, or as :class:`NvmlActuator` without nvidia-ml-py, a driver or
        the GPU.
    NotSupportedError
        For a MIG instance (zeusd locks a whole GPU's clock).
    """

    def __init__(
        self,
        *,
        index: int | None = None,
        client: ZeusdClient | None = None,
        gpu: GpuChoice | None = None,
    ) -> None:
        self.client = client if client is not None else ZeusdClient()
        super().__init__(index=index, gpu=gpu)
        if self.gpu.index is None:
            self.close()
            raise NotSupportedError(
                f"zeusd cannot lock the clock of {self.gpu.label}: it locks a whole GPU's clock, "
                "and a MIG instance shares its GPU's; --actuator dry-run measures it instead"
            )
        self.gpu_id: int = self.gpu.index

    @property
    def kind(self) -> str:
        """``"zeusd"``."""
        return "zeusd"

    def _lock(self, freq_mhz: int) -> None:
        """Lock the SM clock at ``freq_mhz`` (min = max) through the daemon.

        Raises
        ------
        PermissionDeniedError
            If the daemon refuses (token, scope, or its own lack of privilege).
        """
        self.client.post(
            "/gpu/set_gpu_locked_clocks",
            gpu_ids=self.gpu_id,
            min_clock_mhz=freq_mhz,
            max_clock_mhz=freq_mhz,
            block=True,
        )

    def _unlock(self) -> None:
        """Unlock the SM clock through the daemon (``/gpu/reset_gpu_locked_clocks``)."""
        self.client.post("/gpu/reset_gpu_locked_clocks", gpu_ids=self.gpu_id, block=True)
