"""Real-server proof of ``autotune watch``: does it stay quiet on a steady workload, and say "stale"
when the traffic changes?

One run against one stack (``--stack vllm`` or ``llamacpp``), the demo pair, and the newest profile
that stack's tune stored for this host and pair (``--profile ID`` to pick one). The server is
started with the profile's own exported flags (what a user would run), and ``autotune watch --json``
follows it as a separate process (exactly the command a user runs), while this script drives the
load through phases, each a closed loop at one concurrency:

1. **steady**: the workload's code prompts at the lowest tuned concurrency, ``--steady-min``
   minutes (default 10): every stale verdict here is a false alarm;
2. **prose**: prose prompts (``--prose``, default ``benchmarks/configs/prose_prompts.jsonl``: 65
   paragraphs of the GPL-3, GFDL-1.3, MPL-2.0, Apache-2.0 and CC0 texts; the demo pair was trained on
   Python code), same concurrency, ``--switch-min`` minutes: acceptance drops; the detection delay
   is the time from the switch to the first stale window;
3. **code-again**: back to the steady workload: the profile should turn fresh again;
4. **saturation**: the code prompts at the largest tuned concurrency: stale only where the profile's
   own by-load decision says another K is better there.

``--phases`` picks and orders them; ``sampled`` (the code prompts at temperature 1 instead of the
workload's greedy decoding, the same concurrency as steady) is a second way to move acceptance.

Then, for each phase that turned stale, the named alternative is **measured**: the phase's workload
against the served configuration and against the alternative K, ``--confirm-rounds`` interleaved
rounds (both servers kept alive), as a paired ratio with its 95% interval beside the watch's
predicted gain.

Printed: one row per phase (its tokens/s, windows, alarms, stale windows, delay, the named
alternative with predicted and measured gain), and the watch's lines as they came. JSON:
``benchmarks/results/watch_drift_<stack>.json`` (every window the watch printed, with the phase it
fell in; rewritten after each phase, ``complete`` false until the end). Usage::

    python -m benchmarks.watch.watch_drift --stack vllm [--config tune.yaml] [--profile ID] \
[--steady-min 10] [--switch-min 3] [--interval 15] [--windows-to-stale 3] [--confirm-rounds 3]

With ``--retune``, the first phase that turned stale is then re-tuned for real, exactly as
``autotune watch --retune`` would (:func:`autotune.jobs.retune.retune`: the phase's prompts as the
recent-prompts JSONL, sampled phases with their temperature on every line, the load levels around
the phase's live requests running, the same stack), after the benchmark's own servers are
stopped; the row says whether the re-tune's choice is the alternative the watch named. On
vLLM-CPU that is a whole ``autotune tune --backend vllm`` (15-30 minutes on a 2-core host); on
llama-server a few minutes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune import context
from autotune.backends.openai_load import Endpoint, run_http_load
from autotune.cli.text import columns
from autotune.config import load_config
from autotune.errors import USER_ERRORS
from autotune.knobs import Knobs
from autotune.stats import paired_ratio
from autotune.watch.output import verdict_json
from autotune.watch.predict import assess
from autotune.watch.profile_model import ProfileModel
from autotune.watch.staleness import Staleness
from autotune.watch.windows import Window
from autotune.workload.runner import Sampling, build_requests
from benchmarks._common import claim_dir, stamp
from benchmarks._schedule import identity, write_json
from benchmarks._transfer import newest_profile
from engine.workload import load_workload
from profiles.profile import export_inputs
from profiles.schema import Profile
from profiles.store import Store

ROOT = Path(__file__).resolve().parents[2]

PROSE = ROOT / "benchmarks" / "configs" / "prose_prompts.jsonl"


def arguments() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stack", choices=("vllm", "llamacpp"), required=True)
    p.add_argument("--config", type=Path, default=ROOT / "tune.yaml")
    p.add_argument("--profile", type=int, default=None, help="profile id (default: the stack's newest)")
    p.add_argument("--storage", default=None, help="SQLAlchemy URL (default: the config's storage.url)")
    p.add_argument("--prose", type=Path, default=PROSE)
    p.add_argument("--steady-min", type=float, default=10.0)
    p.add_argument("--switch-min", type=float, default=3.0)
    p.add_argument("--interval", type=float, default=15.0, help="the watch's --interval")
    p.add_argument("--windows-to-stale", type=int, default=3)
    p.add_argument(
        "--low", type=int, default=None, help="concurrency of phases 1-3 (default: the lowest level)"
    )
    p.add_argument(
        "--high", type=int, default=None, help="concurrency of phase 4 (default: the largest level)"
    )
    p.add_argument(
        "--phases",
        type=lambda text: [x.strip() for x in text.split(",") if x.strip()],
        default=["steady", "prose", "code-again", "saturation"],
        help="phases in order (steady, prose, sampled: the code prompts at temperature 1, code-again, "
        "saturation); default steady,prose,code-again,saturation",
    )
    p.add_argument("--confirm-rounds", type=int, default=3)
    p.add_argument("--confirm-requests", type=int, default=None, help="per round (default: 8 x concurrency)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument(
        "--retune",
        action="store_true",
        help="re-tune the first stale phase for real (autotune.jobs.retune.retune) and compare its choice",
    )
    p.add_argument(
        "--tune-if-missing",
        action="store_true",
        help="no profile of the stack for this host and pair: run `autotune tune --backend STACK` on "
        "--config first (what a user does before watching), then watch its profile",
    )
    p.add_argument(
        "--replay",
        type=Path,
        default=None,
        help="judge the windows of an earlier run's JSON again with this checkout's rule (no server)",
    )
    return p.parse_args()


class WatchProcess:
    """``autotune watch --json`` as a subprocess; each line kept with the time it arrived."""

    def __init__(self, url: str, stack: str, profile_id: int, storage: str, args, log: Path) -> None:
        self.command = [
            sys.executable,
            "-m",
            "autotune",
            "watch",
            "--url",
            url,
            "--backend",
            stack,
            "--json",
            "--profile",
            str(profile_id),
            "--storage",
            storage,
            "--interval",
            f"{args.interval:g}",
            "--windows-to-stale",
            str(args.windows_to_stale),
        ]
        self.windows: list[dict] = []
        self._err = log.open("w")
        self.proc = subprocess.Popen(
            self.command, stdout=subprocess.PIPE, stderr=self._err, text=True, cwd=ROOT
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            obj["received_s"] = time.time()
            self.windows.append(obj)
            print("  watch: " + summary_line(obj), file=sys.stderr)

    def stop(self) -> int:
        self.proc.terminate()
        try:
            rc = self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self._reader.join(5)
        self._err.close()
        return rc


def summary_line(w: dict) -> str:
    if w.get("idle"):
        return f"idle window ({w.get('window_s')} s)"
    gain = w.get("predicted_gain")
    ci = w.get("gain_ci95")
    return (
        f"acceptance {_f(w.get('acceptance_rate'), '.2f')} "
        f"(profile {_f(w.get('profile_acceptance_rate'), '.2f')}) "
        f"at ~{_f(w.get('requests_running'), '.1f')} running, served K={w.get('served_k')}: "
        f"K={w.get('alternative_k')} {_f(gain, '.2f')}x"
        + (f" (CI {ci[0]:.2f}-{ci[1]:.2f})" if ci else "")
        + (" alarm" if w.get("alarm") else "")
        + (" STALE" if w.get("stale") else " fresh")
    )


def drive(endpoint: Endpoint, requests: list, concurrency: int, seconds: float, seed: int) -> dict:
    """Closed-loop load at ``concurrency`` for about ``seconds``: batches of 8 x concurrency requests
    (each batch starts at the next prompts), so the drain between batches is a small part."""
    t0, tokens, done, batch_no = time.time(), 0, 0, 0
    per_batch = max(8 * concurrency, 8)
    while time.time() - t0 < seconds:
        off = (batch_no * per_batch) % len(requests)
        run = run_http_load(
            endpoint,
            requests[off:] + requests[:off],
            per_batch,
            concurrency=concurrency,
            seed=seed + batch_no,
            time_limit_s=900,
        )
        tokens += sum(len(r.output_tokens) for r in run.records)
        done += len(run.records)
        batch_no += 1
    t1 = time.time()
    return {
        "start_s": t0,
        "end_s": t1,
        "requests": done,
        "tokens": tokens,
        "tokens_per_second": tokens / (t1 - t0),
    }


def phase_windows(windows: list[dict], phase: dict) -> list[dict]:
    """The windows whose middle falls inside the phase."""
    out = []
    for w in windows:
        mid = w["received_s"] - (w.get("window_s") or 0.0) / 2
        if phase["start_s"] <= mid < phase["end_s"]:
            out.append(w)
    return out


def judge(phase: dict, windows: list[dict]) -> dict:
    """What the watch said during a phase."""
    live = [w for w in windows if not w.get("idle")]
    stale = [w for w in windows if w.get("stale")]
    # the window where the state turned stale in this phase (a phase entered stale is not a detection)
    first = next((w for w in windows if w.get("stale") and w.get("changed")), None)
    out = {
        "windows": len(windows),
        "idle_windows": len(windows) - len(live),
        "alarm_windows": sum(bool(w.get("alarm")) for w in windows),
        "stale_windows": len(stale),
        "stale_at_start": bool(windows and windows[0].get("stale") and not windows[0].get("changed")),
        "stale_at_end": bool(windows and windows[-1].get("stale")),
        "acceptance_rate": _mean([w.get("acceptance_rate") for w in live]),
        "requests_running": _mean([w.get("requests_running") for w in live]),
        "served_k": statistics.mode([w["served_k"] for w in live]) if live else None,
        "level_choice_k": live[-1].get("level_choice_k") if live else None,
        "first_stale": None,
    }
    if first is not None:
        out["first_stale"] = {
            "after_s": round(first["received_s"] - phase["start_s"], 1),
            "window": windows.index(first) + 1,
            "alternative_k": first["alternative_k"],
            "predicted_gain": first["predicted_gain"],
            "gain_ci95": first.get("gain_ci95"),
            "predicted_with": first.get("predicted_with"),
        }
    fresh_again = next(
        (
            i + 1
            for i, w in enumerate(windows)
            if not w.get("stale") and any(x.get("stale") for x in windows[:i])
        ),
        None,
    )
    out["fresh_again_window"] = fresh_again
    return out


def _f(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _mean(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def confirm(
    backend, served: list[str], alternative: list[str], requests, concurrency, n, rounds, seed
) -> dict:
    """The phase's workload on the served configuration and on the alternative, interleaved rounds."""
    tps: dict[str, list[float]] = {"served": [], "alternative": []}
    for r in range(rounds):
        for name, command in (("served", served), ("alternative", alternative)):
            server = backend.server_for(command)
            endpoint = backend.endpoint(server)
            run = run_http_load(
                endpoint, requests, n, concurrency=concurrency, seed=seed + r, time_limit_s=900
            )
            tps[name].append(run.metrics["tokens_per_second"])
            print(f"  confirm round {r + 1} {name}: {tps[name][-1]:.1f} tok/s", file=sys.stderr)
    ratio = paired_ratio(tps["alternative"], tps["served"])
    return {
        "tokens_per_second": tps,
        "measured_gain": ratio.as_dict(),
        "measured_gain_text": ratio.text(unit="x"),
    }


def phase_prompts(source: Path, temperature: float | None, out: Path) -> Path:
    """The recent-prompts JSONL a re-tune of a phase reads: ``source``'s lines, each with
    ``temperature`` set when the phase sampled (the workload's own otherwise)."""
    lines = []
    for line in source.read_text().splitlines():
        if not line.strip():
            continue
        obj = json.loads(line)
        if temperature is not None:
            obj["temperature"] = temperature
        lines.append(json.dumps(obj))
    out.write_text("\n".join(lines) + "\n")
    return out


def retune_phase(cfg, stack: str, phase: dict, prompts: Path) -> dict:
    """:func:`autotune.jobs.retune.retune` on the phase (its prompts, its live load); what it chose
    against the K the watch named."""
    from autotune.jobs.retune import retune

    first = phase["first_stale"]
    batch = phase.get("requests_running") or float(phase["concurrency"])
    lines: list[str] = []
    t0 = time.time()
    profile = retune(
        cfg, prompts, stack, batch, lambda line: (lines.append(line), print(line, file=sys.stderr))
    )
    chosen = profile["chosen"]
    k = 0 if chosen.get("drafter") == "none" else int(chosen.get("gamma", 0))
    return {
        "phase": phase["phase"],
        "prompts": str(prompts),
        "requests_running": batch,
        "profile_id": profile.get("id"),
        "chosen_k": k,
        "schedule": [[e["batch_size"], e["gamma"]] for e in profile.get("schedule", [])],
        "named_k": first["alternative_k"],
        "agrees": k == first["alternative_k"],
        "speedup_over_baseline": (profile.get("metrics") or {}).get("speedup"),
        "selection": (profile.get("selection") or {}).get("reason"),
        "wall_s": time.time() - t0,
        "log": lines,
    }


def window_of(w: dict) -> Window:
    """A recorded ``--json`` window back as the counter differences it was derived from."""
    seconds = w.get("window_s") or 0.0
    drafts = (w.get("drafts_per_second") or 0.0) * seconds
    accepted = None if w.get("mean_accepted_length") is None else (w["mean_accepted_length"] - 1) * drafts
    draft_tokens = None if w.get("mean_draft_length") is None else w["mean_draft_length"] * drafts
    generated = (
        None if w.get("generated_tokens_per_second") is None else w["generated_tokens_per_second"] * seconds
    )
    return Window(
        seconds,
        drafts,
        draft_tokens,
        accepted,
        tuple(a * drafts for a in w.get("live_acceptance") or []),
        generated,
        w.get("requests_running"),
        w.get("requests_waiting"),
    )


def rejudge(result: dict, model: ProfileModel, windows_to_stale: int, margin: float = 1.05) -> None:
    """Judge the recorded windows again with this checkout's rule (``--replay``): each window's
    verdict replaced in place, the phases judged again; the measured confirmations are kept."""
    staleness = Staleness(windows_to_stale, margin)
    for w in result["windows"]:
        verdict = staleness.update(assess(model, window_of(w), result["stack"]))
        received = w["received_s"]
        w.clear()
        w.update(verdict_json(verdict, model, result["stack"]), received_s=received)
    for phase in result["phases"]:
        phase.update(judge(phase, phase_windows(result["windows"], phase)))


def replay(args: argparse.Namespace) -> None:
    """``--replay JSON``: the recorded windows of an earlier run judged by this checkout's rule."""
    result = json.loads(args.replay.read_text())
    if "profile_json" in result:  # recorded with the run
        model = ProfileModel.from_profile(Profile.from_json(result["profile_json"]))
    else:  # an older run's JSON: the profile from the store it was tuned into
        store = Store(args.storage or load_config(args.config).storage.url)
        try:
            model = ProfileModel.from_profile(store.load_profile(result["profile"]["id"]))
        finally:
            store.close()
    rejudge(result, model, result["windows_to_stale"])
    result["replayed_from"] = str(args.replay)
    out = args.out or args.replay.with_name(args.replay.stem + "_replayed.json")
    write_json(out, result)
    report(result)
    print(f"\nwrote {out}")


@dataclass
class Run:
    """One live run: its flags, the config with the stack's overrides, the context, the stack's
    backend, the profile it serves and the prose requests; what every step below reads."""

    args: argparse.Namespace
    cfg: Any
    ctx: Any
    backend: Any
    prof: dict  # the stored profile served (its JSON)
    prose: list  # the --prose prompts as requests
    tuned_first: bool = False  # no profile was stored: this run tuned one first (--tune-if-missing)
    log_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="watch_drift_")))

    @property
    def out(self) -> Path:
        """The JSON (``--out``, by default in the claim's folder)."""
        stack = self.args.stack
        return self.args.out or claim_dir(f"watch_drift_{stack}") / f"watch_drift_{stack}.json"

    @property
    def low(self) -> int:
        """The concurrency of the phases at low load (``--low``, by default the lowest level)."""
        return self.args.low or sorted(self.cfg.batch_sizes)[0]

    @property
    def high(self) -> int:
        """The concurrency of the saturation phase (``--high``, by default the largest level)."""
        return self.args.high or sorted(self.cfg.batch_sizes)[-1]


def main() -> None:
    args = arguments()
    if args.replay is not None:
        try:
            replay(args)
        except USER_ERRORS as exc:
            print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
            sys.exit(2)
        return
    run = open_run(args)
    served = served_command(run)
    result = opening(run, served)
    workloads = phase_workloads(run)
    plan = phase_plan(args.phases, workloads)
    t_start = time.time()
    try:
        watch_phases(run, served, plan, result)
        confirm_stale(run, served, workloads, result)
    finally:
        run.backend.close()
    retune_first_stale(run, result)
    result["wall_s"] = time.time() - t_start
    result["complete"] = True
    write_json(run.out, result)
    report(result)
    print(f"\nwrote {run.out}")


def tune_first(args: argparse.Namespace, storage: str) -> None:
    """``autotune tune --backend STACK`` on ``--config`` into ``storage``, as its own process (the
    command a user runs); its output goes to stderr, a failed tune is this run's failure."""
    argv = [sys.executable, "-m", "autotune", "tune", "--backend", args.stack, "--config", str(args.config)]
    print(f"no {args.stack} profile yet: {' '.join(argv[1:])} --storage {storage}", file=sys.stderr)
    code = subprocess.run([*argv, "--storage", storage], stdout=sys.stderr).returncode
    if code:
        raise SystemExit(f"error: the tune before watching failed (exit {code})")


def open_run(args: argparse.Namespace) -> Run:
    """The config with the stack's overrides, its context and backend, the profile to serve and the
    prose requests; a user error (or no profile) is one line and exit 2."""
    try:
        cfg = load_config(args.config)
        overrides = {"backend.name": args.stack}
        if args.storage:
            overrides["storage.url"] = args.storage
        cfg = cfg.with_overrides(overrides)
        ctx = context.build(cfg)  # a stack backend with a stored engine profile: no engine compile
        if args.stack == "vllm":
            from autotune.backends.vllm import VllmBackend

            backend = VllmBackend(ctx)
        else:
            from autotune.backends.llamacpp import LlamacppBackend

            backend = LlamacppBackend(ctx)
        prof = newest_profile(ctx, args.stack, args.profile)
        tuned = prof is None and args.tune_if_missing and args.profile is None
        if tuned:
            tune_first(args, cfg.storage.url)
            prof = newest_profile(ctx, args.stack, None)
        if prof is None:
            raise SystemExit(
                f"error: no {args.stack} profile for this host and pair in {cfg.storage.url} "
                f"(run `autotune tune --backend {args.stack}`, or pass --profile ID)"
            )
        w = cfg.workload
        sampling = Sampling(w.max_new_tokens, w.temperature, w.top_k, w.top_p)
        context_len = ctx.files.context_length
        prose = build_requests(
            load_workload(args.prose),
            ctx.files.tokenizer,
            sampling,
            context_len,
            str(args.prose),
            truncate=True,
        )
    except USER_ERRORS as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        sys.exit(2)
    return Run(args, cfg, ctx, backend, prof, prose, tuned)


def served_command(run: Run) -> list[str]:
    """The server command of the profile's own exported flags (what a user would run)."""
    backend, profile = run.backend, Profile.from_json(run.prof)
    if run.args.stack == "vllm":
        from autotune.backends.vllm import serve_command

        return serve_command(
            backend.python, dataclasses.replace(export_inputs(profile), deployment=backend.deployment)
        )
    inputs = export_inputs(
        profile, str(backend.target_gguf), str(backend.draft_gguf) if backend.draft_gguf else None
    )
    return backend.profile_command(inputs)


def command_for_k(run: Run, k: int) -> list[str]:
    """The server command of constant K with the profile's drafter (the draft model where it chose
    none): the alternative the watch named."""
    drafter = run.prof["chosen"].get("drafter", "model")
    if drafter == "none":
        drafter = "model"
    batch = max(run.cfg.search.max_batch_size)
    return run.backend.command(Knobs(drafter if k else "none", k, 0.0, max_batch_size=batch))


def opening(run: Run, served: list[str]) -> dict:
    """The JSON before any phase ran: the run's identity, the profile and the watch's settings."""
    args, ctx, prof = run.args, run.ctx, run.prof
    return {
        **identity(ctx, args.config),
        **stamp(ctx.fingerprint["label"]),
        "stack": args.stack,
        "profile": {k: prof.get(k) for k in ("id", "chosen", "schedule", "table_decision")},
        "profile_json": prof,  # the whole profile: --replay judges with it, no store needed
        "tuned_first": run.tuned_first,
        "served_args": served[1:],
        "interval_s": args.interval,
        "windows_to_stale": args.windows_to_stale,
        "phases": [],
        "complete": False,
    }


def phase_workloads(run: Run) -> dict[str, tuple[list, int, float]]:
    """Every phase by name: its requests, its concurrency and its minutes."""
    args, code, low = run.args, run.ctx.requests, run.low
    sampled = [dataclasses.replace(r, temperature=1.0) for r in code]  # the same prompts, sampled at T=1
    return {
        "steady": (code, low, args.steady_min),
        "prose": (run.prose, low, args.switch_min),
        "sampled": (sampled, low, args.switch_min),
        "code-again": (code, low, args.switch_min),
        "saturation": (code, run.high, args.switch_min),
    }


def phase_plan(names: list[str], workloads: dict[str, tuple[list, int, float]]) -> list[tuple]:
    """The ``--phases`` in order, each ``(name, requests, concurrency, minutes)``; an unknown name
    is one line and exit 2."""
    unknown = [name for name in names if name not in workloads]
    if unknown:
        print(
            f"error: --phases: unknown {', '.join(unknown)} (choose from {', '.join(workloads)})",
            file=sys.stderr,
        )
        sys.exit(2)
    return [(name, *workloads[name]) for name in names]


def watch_phases(run: Run, served: list[str], plan: list[tuple], result: dict) -> None:
    """The served configuration's server, warmed up, and ``autotune watch --json`` following it while
    the phases run; then each phase judged by the windows that fell in it. The JSON is rewritten
    after each phase."""
    args, backend = run.args, run.backend
    server = backend.server_for(served)
    endpoint = backend.endpoint(server)
    result["startup_s"] = server.startup_s
    run_http_load(
        endpoint, run.ctx.requests, max(run.high, 4), concurrency=max(run.high, 4), seed=0, time_limit_s=600
    )  # warm-up
    watcher = WatchProcess(
        server.base_url, args.stack, run.prof["id"], run.cfg.storage.url, args, run.log_dir / "watch.stderr"
    )
    try:
        result["watch_command"] = watcher.command
        time.sleep(args.interval * 1.5)  # the watch's first scrape is the baseline
        for name, reqs, conc, minutes in plan:
            print(f"phase {name}: concurrency {conc}, {minutes:g} min", file=sys.stderr)
            measured = drive(endpoint, reqs, conc, minutes * 60, run.cfg.budget.seed)
            result["phases"].append({"phase": name, "concurrency": conc, "minutes": minutes, **measured})
            result["windows"] = watcher.windows
            write_json(run.out, result)
        time.sleep(args.interval)  # the last phase's last window
    except BaseException:
        watcher.stop()
        raise
    result["watch_rc"] = watcher.stop()
    result["watch_stderr"] = (run.log_dir / "watch.stderr").read_text().splitlines()
    result["windows"] = watcher.windows
    for phase in result["phases"]:
        phase.update(judge(phase, phase_windows(result["windows"], phase)))
    write_json(run.out, result)


def confirm_stale(
    run: Run, served: list[str], workloads: dict[str, tuple[list, int, float]], result: dict
) -> None:
    """For each phase that turned stale, the alternative the watch named measured against the
    served flags on the phase's workload (:func:`confirm`); the JSON rewritten after each."""
    args = run.args
    for phase in result["phases"]:
        first = phase["first_stale"]
        if first is None or first["alternative_k"] is None:
            continue
        reqs = workloads[phase["phase"]][0]
        n = args.confirm_requests or max(8 * phase["concurrency"], 8)
        print(
            f"confirming {phase['phase']}: K={first['alternative_k']} vs the served flags",
            file=sys.stderr,
        )
        phase["confirm"] = confirm(
            run.backend,
            served,
            command_for_k(run, first["alternative_k"]),
            reqs,
            phase["concurrency"],
            n,
            args.confirm_rounds,
            run.cfg.budget.seed,
        )
        write_json(run.out, result)


def retune_first_stale(run: Run, result: dict) -> None:
    """With ``--retune``, the first phase that named an alternative re-tuned for real
    (:func:`retune_phase` on that phase's prompts), after the benchmark's servers are stopped."""
    args = run.args
    stale = next(
        (ph for ph in result["phases"] if (ph.get("first_stale") or {}).get("alternative_k") is not None),
        None,
    )
    if args.retune and stale is not None:
        source = args.prose if stale["phase"] == "prose" else Path(run.cfg.workload.prompts)
        temperature = 1.0 if stale["phase"] == "sampled" else None
        prompts = phase_prompts(source, temperature, run.log_dir / f"{stale['phase']}_prompts.jsonl")
        print(f"re-tuning the {stale['phase']} phase on {args.stack}", file=sys.stderr)
        result["retune"] = retune_phase(run.cfg, args.stack, stale, prompts)
        write_json(run.out, result)


def report(result: dict) -> None:
    rows = []
    for p in result["phases"]:
        first = p.get("first_stale") or {}
        conf = p.get("confirm")
        ci = first.get("gain_ci95")
        rows.append(
            [
                p["phase"],
                p["concurrency"],
                f"{p['tokens_per_second']:.1f}",
                _f(p.get("acceptance_rate"), ".2f"),
                _f(p.get("requests_running"), ".1f"),
                p.get("windows"),
                p.get("alarm_windows"),
                p.get("stale_windows"),
                f"{first['after_s']:.0f} s (window {first['window']})" if first else "-",
                f"K={first['alternative_k']}" if first else "-",
                (f"{first['predicted_gain']:.2f}x" + (f" ({ci[0]:.2f}-{ci[1]:.2f})" if ci else ""))
                if first
                else "-",
                conf["measured_gain_text"] if conf else "-",
            ]
        )
    print(
        columns(
            [
                "phase",
                "conc.",
                "tok/s",
                "acceptance",
                "running",
                "windows",
                "alarms",
                "stale",
                "first stale",
                "named",
                "predicted gain",
                "measured gain",
            ],
            rows,
        )
    )
    prof = result["profile"]
    print(f"\nprofile #{prof['id']}: chosen {prof['chosen']}, served {' '.join(result['served_args'])}")
    rt = result.get("retune")
    if rt:
        print(
            f"re-tune of the {rt['phase']} phase ({rt['wall_s'] / 60:.1f} min, ~{rt['requests_running']:.1f} "
            f"requests running): profile #{rt['profile_id']} chose K={rt['chosen_k']} (schedule "
            f"{rt['schedule']}); the watch had named K={rt['named_k']}: "
            + ("the same" if rt["agrees"] else "different")
            + f"; {rt['selection']}"
        )


if __name__ == "__main__":
    main()
