"""One serving-stack process: launched in its own process group, probed, stopped, never orphaned.

A :class:`ServerProcess` starts a command with ``start_new_session`` (so the server and every
worker it forks share one process group), logs to a file, waits for ``GET <health_path>`` to
answer 200 and stops the whole group with SIGTERM, then SIGKILL after a grace period.

No server outlives ``autotune``:

- a normal stop, an exception or Ctrl-C/SIGTERM (which ``autotune tune`` turns into
  KeyboardInterrupt) stop the group in the caller's ``with`` block;
- :func:`stop_all` runs at interpreter exit for anything still registered;
- if ``autotune`` itself is killed (SIGKILL, a crash of the interpreter), the launched command
  is expected to watch ``AUTOTUNE_PARENT_PID`` and kill its own group (the vLLM launcher does).

A server that exits before it is ready, or is not ready within ``startup_timeout_s``, raises
:class:`ServerError` whose message ends with the tail of its log.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

_LIVE: set[ServerProcess] = set()


class ServerError(RuntimeError):
    """A server failed to start, died, or hung; the message carries the tail of its log."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def log_tail(path: Path, lines: int = 15, max_chars: int = 2000) -> str:
    """The last ``lines`` non-empty lines of a log file, joined with `` | `` (for one-line reasons)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(kept)[-max_chars:] or "(empty log)"


class ServerProcess:
    """A server command in its own process group, with a log file and a readiness probe.

    Example:
        >>> import sys, tempfile
        >>> log = Path(tempfile.mkdtemp()) / "server.log"
        >>> cmd = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "{port}"]
        >>> with ServerProcess(cmd, log, health_path="/", startup_timeout_s=30) as server:
        ...     server.get("/").startswith("<!DOCTYPE")
        True
    """

    def __init__(
        self,
        command: Sequence[str],
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        health_path: str = "/health",
        startup_timeout_s: float = 600.0,
        stop_grace_s: float = 20.0,
        port: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.port = port or free_port()
        self.command = [part.replace("{port}", str(self.port)) for part in command]
        self.log_path = Path(log_path)
        self.env = dict(env or {})
        self.health_path = health_path
        self.startup_timeout_s = startup_timeout_s
        self.stop_grace_s = stop_grace_s
        self.clock = clock
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None
        self.warmed = False  # the backend's warm-up run has been served (HttpBackend.run_command)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ServerProcess:
        """Launch and block until healthy; ServerError (with the log tail) otherwise."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.env, "AUTOTUNE_PARENT_PID": str(os.getpid())}
        t0 = self.clock()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        _LIVE.add(self)
        try:
            self._wait_ready(self.proc, t0)
        except BaseException:
            self.stop()
            raise
        self.startup_s = self.clock() - t0
        return self

    def _wait_ready(self, proc: subprocess.Popen, t0: float) -> None:
        while True:
            code = proc.poll()
            if code is not None:
                raise ServerError(
                    f"server exited with code {code} before it was ready: {log_tail(self.log_path)}"
                )
            try:
                with urllib.request.urlopen(self.base_url + self.health_path, timeout=5) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            if self.clock() - t0 > self.startup_timeout_s:
                raise ServerError(
                    f"server not ready after {self.startup_timeout_s:g} s: {log_tail(self.log_path)}"
                )
            time.sleep(0.5)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self, grace_s: float = 0.0) -> None:
        """ServerError with the log tail when the server process has exited (waiting up to ``grace_s`` for it).

        A request that fails because the server is dying can return before the process is gone:
        the grace lets the caller report the death, not the dropped connection.
        """
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            return
        raise ServerError(f"server died (exit code {self.proc.returncode}): {log_tail(self.log_path)}")

    def get(self, path: str, timeout: float = 30.0) -> str:
        """GET a path of the server; the body as text."""
        with urllib.request.urlopen(self.base_url + path, timeout=timeout) as resp:
            return resp.read().decode("utf-8", errors="replace")

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL it after ``stop_grace_s``; idempotent."""
        proc, self.proc = self.proc, None
        _LIVE.discard(self)
        if proc is None:
            return
        stop_group(proc.pid, self.stop_grace_s)
        try:
            proc.wait(timeout=self.stop_grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(pgid: int, grace_s: float) -> None:
    """SIGTERM every process of group ``pgid``; SIGKILL what is left after ``grace_s``."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:  # reap the leader if it is our child, so the group can empty
            os.waitpid(pgid, os.WNOHANG)
        except ChildProcessError:
            pass
        if not _group_alive(pgid):
            return
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def stop_all() -> None:
    """Stop every server still registered (runs at interpreter exit)."""
    for server in list(_LIVE):
        server.stop()


atexit.register(stop_all)
