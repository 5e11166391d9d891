"""The watch service's own Prometheus metrics: the text of the last verdict and the endpoint serving it
(``--metrics-port``)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Sequence
from typing import Any

from autotune.errors import ConfigError
from autotune.watch.staleness import Verdict


def metrics_text(
    v: Verdict | None, stack: str | None, windows: int, errors: int, resets: int, profile_id: int | None
) -> str:
    """The watch's own Prometheus text (served on ``--metrics-port``)."""
    out: list[str] = []

    def metric(name: str, kind: str, help_: str, rows: Sequence[tuple[str, float | None]]) -> None:
        rows = [(labels, val) for labels, val in rows if val is not None]
        if not rows:
            return
        out.extend([f"# HELP {name} {help_}", f"# TYPE {name} {kind}"])
        out.extend(f"{name}{labels} {val:g}" for labels, val in rows)

    info = f'{{backend="{stack or "unknown"}",profile="{profile_id if profile_id is not None else ""}"}}'
    metric("autotune_watch_info", "gauge", "What is watched, against which stored profile.", [(info, 1)])
    metric("autotune_windows_total", "counter", "Windows derived from two scrapes.", [("", windows)])
    metric("autotune_scrape_errors_total", "counter", "Failed or unreadable scrapes.", [("", errors)])
    metric(
        "autotune_counter_resets_total", "counter", "Windows skipped: the server restarted.", [("", resets)]
    )
    if v is not None:
        a, w = v.assessment, v.assessment.window
        live = w.per_position_acceptance if a.acceptance_source == "live" else []
        metric(
            "autotune_live_acceptance",
            "gauge",
            "Live acceptance at draft position (1-based, unconditional) in the last window.",
            [(f'{{position="{i + 1}"}}', x) for i, x in enumerate(live)],
        )
        metric(
            "autotune_requests_running",
            "gauge",
            "Mean requests running in the last window.",
            [("", w.running)],
        )
        metric(
            "autotune_generated_tokens_per_second",
            "gauge",
            "Generated tokens/s in the last window.",
            [("", w.tokens_per_second)],
        )
        metric("autotune_served_k", "gauge", "The profile's K at the live load.", [("", a.served_k)])
        metric("autotune_alternative_k", "gauge", "The best other K predicted.", [("", v.alternative)])
        metric(
            "autotune_predicted_gain",
            "gauge",
            "Predicted tokens/s of the alternative K over the served K.",
            [("", v.gain.value)],
        )
        metric(
            "autotune_predicted_gain_low",
            "gauge",
            "Lower bound of the gain's 95% interval over the alarm streak.",
            [("", v.gain.low)],
        )
        metric("autotune_profile_stale", "gauge", "1 when the profile is stale.", [("", int(v.stale))])
    else:
        metric("autotune_profile_stale", "gauge", "1 when the profile is stale.", [("", 0)])
    return "\n".join(out) + "\n"


class MetricsServer:
    """The watch's own /metrics (http.server in a daemon thread); ``close`` stops it."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._text = metrics_text(None, None, 0, 0, 0, None)
        self._lock = threading.Lock()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if self.path.split("?", 1)[0] not in ("/metrics", "/"):
                    self.send_error(404)
                    return
                body = owner.text.encode("utf-8")
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        try:
            self._server = http.server.ThreadingHTTPServer((host, port), Handler)
        except OSError as exc:
            raise ConfigError(
                f"--metrics-port {port}: cannot listen on {host}:{port} ({exc.strerror})"
            ) from None
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="autotune-watch-metrics")
        self._thread.daemon = True
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def text(self) -> str:
        with self._lock:
            return self._text

    def update(self, text: str) -> None:
        with self._lock:
            self._text = text

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
