"""``autotune watch``: follow a live server's /metrics and say when its stored profile no longer holds.

The logic is :mod:`autotune.watch` (its modules: scrape, windows, predict, staleness, output,
endpoint, loop); this module opens the store, takes the first scrape,
picks the profile (:mod:`autotune.watch.match`: the newest of the model the server's /v1/models
names, tuned on its stack), wires the output (human lines or ``--json`` on stdout, warnings on
stderr, the optional Prometheus endpoint) and turns Ctrl-C (or SIGTERM) into a clean exit 0.
Usage errors (a bad URL, no profile, no profile of the served model, an unreadable profile, a port
that cannot be bound) are one line and exit code 2 (the group's mapping).
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import click

from autotune.cli.options import CONFIG_OPTION, say_err
from autotune.errors import ConfigError
from profiles.errors import ProfileError
from profiles.schema import Profile


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _store(config_path: Path, storage: str | None):
    from profiles.store import DEFAULT_URL, Store

    url = storage
    if url is None:
        if config_path.is_file():
            from autotune.config import load_config

            url = load_config(config_path).storage.url
        else:
            url = DEFAULT_URL
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        db = Path(url[len("sqlite:///") :])
        if not db.is_file():
            raise ProfileError(f"{db}: no profile database (run `autotune tune`, or pass --storage URL)")
    return Store(url)


def _pick_profile(
    store, profile_id: int | None, stack: str, target: str, timeout: float
) -> tuple[Profile, str]:
    """The profile to hold the server against, and a note on why it was picked: ``--profile``, else
    the newest of the model the server's /v1/models names (:mod:`autotune.watch.match`)."""
    from autotune.watch import match
    from profiles.hashing import hash_folder

    url = match.models_url(target)
    try:
        served: list[match.ServedModel] | None = match.fetch_models(url, timeout)
    except (OSError, ValueError) as exc:
        say_err(f"note: cannot read {url} ({exc}): the served model is not checked")
        served = None
    if profile_id is not None:
        profile = store.load_profile(profile_id)
        warning = match.check_profile(profile, served, hash_folder)
        if warning is not None:
            say_err(warning)
        return profile, "--profile"
    pick = match.pick_profile(store.list_profiles(), store.load_profile, stack, served, hash_folder)
    return pick.profile, pick.why


def _retune(cfg, prompts: Path, stack: str, verdict, model) -> int:
    """One re-tune for a stale profile (:func:`autotune.jobs.retune.retune`); a failure is a warning line
    and the watch goes on. Returns the new profile's id (0 when it failed)."""
    from autotune.errors import USER_ERRORS
    from autotune.jobs.retune import retune

    say_err(
        f"profile #{model.profile_id} stale: predicted K={verdict.alternative} "
        f"{verdict.gain.value:.2f}x over the served K={verdict.assessment.served_k}"
    )
    try:
        profile = retune(cfg, prompts, stack, verdict.assessment.batch, say_err)
    except USER_ERRORS as exc:
        say_err(f"warning: re-tune failed: {exc}; the watch goes on")
        return 0
    except Exception as exc:  # noqa: BLE001 - the watch must outlive a failed re-tune
        say_err(f"warning: re-tune failed ({type(exc).__name__}: {exc}); the watch goes on")
        return 0
    say_err(
        f"restart the server with the new flags, then watch it with --profile {profile.get('id')} "
        "(this watch keeps the old profile: the server still serves it)"
    )
    return int(profile.get("id") or 0)


@click.command()
@click.option("--url", required=True, help="The server's base URL, http://HOST:PORT (its /metrics is read).")
@click.option(
    "--backend",
    "stack",
    type=click.Choice(["vllm", "llamacpp"]),
    default=None,
    help="The serving stack (default: detected from the metric names' prefix).",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=15.0,
    show_default=True,
    help="Seconds between scrapes (one window each).",
)
@click.option(
    "--profile",
    "profile_id",
    type=int,
    default=None,
    help="Stored profile id (default: the newest of the model the server serves, tuned on its stack).",
)
@CONFIG_OPTION
@click.option(
    "--storage", default=None, help="SQLAlchemy URL of the profile store (default: storage.url of --config)."
)
@click.option("--once", is_flag=True, help="One window, then exit 0 (fresh) or 1 (stale).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per window instead of a line.")
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve the watch's own Prometheus metrics on this port (0: any free one).",
)
@click.option(
    "--metrics-host", default="127.0.0.1", show_default=True, help="Address to bind the metrics to."
)
@click.option(
    "--windows-to-stale",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Windows in a row predicting another K better before the profile can be called stale "
    "(and calm ones to clear it).",
)
@click.option(
    "--margin",
    type=click.FloatRange(min=1.0),
    default=1.05,
    show_default=True,
    help="Pooled predicted gain of the alternative K over the served one that makes the profile "
    "stale; windows at most half of it above 1 are calm.",
)
@click.option(
    "--retune",
    "retune_prompts",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="When the profile turns stale, run `autotune tune` once on this JSONL of recent prompts, "
    "the live load and the watched stack (--config's other keys), store it and print the new flags.",
)
def watch(
    url,
    stack,
    interval,
    profile_id,
    config_path,
    storage,
    once,
    as_json,
    metrics_port,
    metrics_host,
    windows_to_stale,
    margin,
    retune_prompts,
):
    """Follow a live vLLM or llama-server and say when the stored profile no longer holds.

    Reads GET /v1/models once (which model the server serves, so the profile is of that model)
    and GET /metrics every --interval seconds. Per window: live acceptance per draft
    position, the load, and the cost model's predicted tokens/s of the served K against every
    other K (speculation off included). Stale after --windows-to-stale windows in a row that
    predict another K better, when their pooled gain exceeds --margin with the interval's lower
    bound above 1; fresh after as many windows within half the margin.

    Long because: a click command; its flags map one to one onto the watch's settings.
    """
    from autotune.watch import endpoint, loop, output, profile_model, scrape
    from autotune.watch.staleness import Staleness, Verdict

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # SIGTERM (a service manager's stop) ends the watch like Ctrl-C

    retune_cfg = None
    if retune_prompts is not None:
        from autotune.config import load_config

        if not retune_prompts.is_file():
            raise ConfigError(f"--retune: {retune_prompts} does not exist (a JSONL of recent prompts)")
        if not config_path.is_file():
            raise ConfigError(f"--retune: {config_path} does not exist (the tune.yaml a re-tune starts from)")
        retune_cfg = load_config(config_path)
    target = scrape.metrics_url(url)
    timeout = min(max(interval, 1.0), 10.0)
    store = _store(config_path, storage)
    try:
        if profile_id is None and not store.list_profiles():
            raise ProfileError("no profile in the store (run `autotune tune`, or pass --storage URL)")
        state = loop.Watch(lambda: scrape.fetch_metrics(target, timeout), stack, say_err)
        staleness = Staleness(windows_to_stale=1 if once else windows_to_stale, margin=margin)
        exporter = None
        previous = signal.signal(signal.SIGTERM, stop) if _main_thread() else None
        try:
            first = state.scrape()
            while first is None:
                if once:
                    raise ConfigError(f"--url: cannot read {target} (see the warning above)")
                time.sleep(interval)
                first = state.scrape()
            state.baseline = first
            prof, why = _pick_profile(store, profile_id, first.stack, target, timeout)
            model = profile_model.ProfileModel.from_profile(prof)
            if model.backend != first.stack:
                say_err(
                    f"note: profile #{model.profile_id} was tuned on {model.backend}, this server is "
                    f"{first.stack}: its acceptance and served K still apply, its step costs are the engine's"
                )
            if metrics_port is not None:
                exporter = endpoint.MetricsServer(metrics_host, metrics_port)
                say_err(f"serving the watch's metrics on http://{metrics_host}:{exporter.port}/metrics")
            say_err(
                f"watching {target} ({first.stack}) against profile #{model.profile_id} ({why}), "
                f"every {interval:g} s"
            )

            retuned: list[int] = []

            def emit(verdict: Verdict) -> None:
                if as_json:
                    click.echo(output.json_line(output.verdict_json(verdict, model, first.stack)))
                else:
                    click.echo(output.render_line(verdict, model))
                if retune_cfg is not None and verdict.stale and verdict.changed and not retuned:
                    retuned.append(_retune(retune_cfg, retune_prompts, first.stack, verdict, model))

            return loop.run(state, model, staleness, emit, interval, once=once, exporter=exporter)
        except KeyboardInterrupt:
            say_err("stopped")
            return 0
        finally:
            if exporter is not None:
                exporter.close()
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
    finally:
        store.close()
