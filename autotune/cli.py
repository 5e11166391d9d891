"""The ``autotune`` command line: one command per verb.

Every user mistake (a bad flag value, a missing model folder, a malformed workload line, an
invalid tune.yaml key) ends with ``error: <one line naming it>`` on stderr and exit code 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from autotune.errors import USER_ERRORS
from autotune.table import table
from engine.demo import DEMO_DRAFT, DEMO_PROMPTS, DEMO_TARGET


def _one_line(exc: BaseException) -> str:
    text = exc.format_message() if isinstance(exc, click.ClickException) else str(exc)
    return " ".join(text.split()) or type(exc).__name__


class _Group(click.Group):
    """Turns user errors raised anywhere below (and bad flags) into one line and exit code 2."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except USER_ERRORS as exc:
            click.echo(f"error: {_one_line(exc)}", err=True)
            sys.exit(2)

    def main(self, *args, **kwargs):
        kwargs["standalone_mode"] = False
        try:
            rv = super().main(*args, **kwargs)
        except click.UsageError as exc:
            hint = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
            click.echo(f"error: {_one_line(exc)}{hint}", err=True)
            sys.exit(2)
        except click.ClickException as exc:
            click.echo(f"error: {_one_line(exc)}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("aborted", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="spec-autotune")
def main() -> None:
    """spec-autotune: measure speculative decoding on this host, tune it, export serving configs.

    \b
    Start here:
      autotune bench            speculative vs autoregressive on the bundled demo pair
      autotune init             write a commented tune.yaml (--target/--draft for your models)
      autotune tune             the main job: profile, Optuna study, store, export
    """


def _print_json(obj: object) -> None:
    click.echo(json.dumps(obj, indent=2, default=str))


BENCH_ROWS = [
    ("tokens_per_second", "tokens/s"), ("requests_per_second", "requests/s"), ("speedup", "speedup (x)"),
    ("acceptance_rate", "acceptance rate"), ("mean_acceptance_length", "mean acceptance length"),
    ("per_position_acceptance", "per-position acceptance"), ("rollback_frequency", "rollback frequency"),
    ("verification_efficiency", "verification efficiency"), ("draft_cost_ratio", "draft cost ratio"),
    ("batch_utilization", "batch utilization"), ("mean_batch_size", "mean batch size"),
    ("ttft_ms_p50", "ttft ms p50"), ("ttft_ms_p95", "ttft ms p95"), ("tpot_ms_p50", "tpot ms p50"),
    ("tpot_ms_p95", "tpot ms p95"), ("e2e_ms_p50", "e2e ms p50"), ("e2e_ms_p95", "e2e ms p95"),
]


@main.command()
@click.option("--target", type=click.Path(path_type=Path), default=DEMO_TARGET, show_default="demo target",
              help="Target model folder (config.json + *.safetensors + tokenizer.json).")
@click.option("--draft", type=click.Path(path_type=Path), default=DEMO_DRAFT, show_default="demo draft",
              help="Draft model folder (for --drafter model).")
@click.option("--drafter", type=click.Choice(["model", "ngram", "none"]), default="model", show_default=True)
@click.option("--gamma", type=click.IntRange(min=0), default=4, show_default=True,
              help="Draft tokens per step (0 = speculation off).")
@click.option("--confidence-threshold", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="A row stops drafting when the draft's top probability falls below this.")
@click.option("--gamma-schedule", type=click.Choice(["constant", "heuristic"]), default="constant", show_default=True)
@click.option("--batch-size", "--max-batch-size", "batch_size", type=click.IntRange(min=1), default=None,
              help="Rows the engine runs at once (continuous batching slots; default: --concurrency, else 1).")
@click.option("--concurrency", type=click.IntRange(min=1), default=None,
              help="Closed loop: requests in flight (default: the batch size). Without --max-batch-size the "
                   "engine runs this many rows; a smaller --max-batch-size queues the rest.")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Open loop: Poisson arrivals per second (instead of --concurrency).")
@click.option("--num-requests", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Stop issuing requests after this many seconds (at most --num-requests).")
@click.option("--max-prefill-tokens", type=click.IntRange(min=1), default=None,
              help="Cap one admission's prefill at this many token slots (requests x longest prompt).")
@click.option("--temperature", type=click.FloatRange(min=0), default=0.0, show_default=True)
@click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True)
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--prompts", type=click.Path(path_type=Path), default=DEMO_PROMPTS, show_default="demo prompts",
              help="JSONL workload: {\"prompt\": ..., \"max_new_tokens\": ...} per line.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--device", default="auto", show_default=True, help="auto, cpu or cuda[:N].")
@click.option("--dtype", default="float32", show_default=True, help="float32, bfloat16 or float16.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def bench(target, draft, drafter, gamma, confidence_threshold, gamma_schedule, batch_size, concurrency, rate,
          num_requests, duration, max_prefill_tokens, temperature, top_k, top_p, max_new_tokens, prompts, seed, device,
          dtype, as_json):
    """Speculative vs autoregressive decoding on the same engine, prompts and load."""
    from autotune.runner import LoadSpec, Sampling, build_requests, compare
    from engine.loader import load_pair
    from engine.speculative import SpecConfig
    from engine.workload import load_workload

    spec = SpecConfig(gamma=gamma, confidence_threshold=confidence_threshold, gamma_schedule=gamma_schedule)
    batch_size = batch_size or (concurrency if rate is None else None) or 1
    items = load_workload(prompts)
    pair = load_pair(target, draft if drafter == "model" else None, dtype=dtype, device=device)
    if pair.tokenizer is None:
        raise click.BadParameter(f"{target}: no tokenizer.json", param_hint="--target")
    sampling = Sampling(max_new_tokens, temperature, top_k, top_p)
    requests = build_requests(items, pair.tokenizer, sampling, pair.target.config.max_position_embeddings,
                              where=str(prompts))
    load = LoadSpec(max_batch_size=batch_size, concurrency=None if rate else (concurrency or batch_size),
                    rate=rate, num_requests=num_requests, duration_s=duration, max_prefill_tokens=max_prefill_tokens)
    result = compare(pair, requests, spec, drafter, load, seed)
    result.update({"gamma": gamma, "drafter": drafter, "confidence_threshold": confidence_threshold,
                   "batch_size": batch_size, "device": str(pair.target.lm_head.weight.device), "dtype": dtype})
    if as_json:
        _print_json(result)
        return
    rows = [(label, result.get(key), result.get(f"baseline_{key}")) for key, label in BENCH_ROWS]
    click.echo(f"drafter={drafter} gamma={gamma} threshold={confidence_threshold} batch={batch_size} "
               f"requests={num_requests} device={result['device']}")
    click.echo(table(["metric", "speculative", "autoregressive"], rows))
    if "greedy_match" in result:
        click.echo(f"greedy_match: {str(result['greedy_match']).lower()}")


@main.command()
@click.option("--target", type=click.Path(path_type=Path), default=None,
              help="Target model folder (default: the bundled demo target, written as `demo`).")
@click.option("--draft", type=click.Path(path_type=Path), default=None,
              help="Draft model folder (required with --target; default: the demo draft).")
@click.option("--prompts", type=click.Path(path_type=Path), default=None,
              help="JSONL workload (default: the demo prompts, written as `demo`).")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("tune.yaml"), show_default=True,
              help="Where to write the tune.yaml.")
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
def init(target, draft, prompts, output, force):
    """Write a commented tune.yaml for your models (the bundled one, with absolute paths)."""
    from autotune.init import write_tune_yaml

    path = write_tune_yaml(output, target, draft, prompts, force)
    click.echo(f"wrote {path}")
    click.echo(f"next: autotune tune --config {path}")


CONFIG_OPTION = click.option("--config", "config_path", type=click.Path(path_type=Path), default="tune.yaml",
                             show_default=True, help="The tuning config (see the bundled tune.yaml).")


def _say_err(msg: str) -> None:
    click.echo(msg, err=True)


@main.command()
@CONFIG_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def profile(config_path, as_json):
    """Fingerprint the device, measure ceilings and verify/draft curves, classify, and store."""
    from autotune import context
    from autotune.config import load_config

    cfg = load_config(config_path)
    ctx = context.build(cfg)
    data, _ = context.ensure_profile(ctx, reprofile=True, progress=lambda s: _say_err(f"  measured: {s}"))
    if as_json:
        _print_json(data)
        return
    click.echo(render_profile(data))


def render_profile(data: dict) -> str:
    """Human view of a profiler measurement: identity, ceilings, knee, batch-size table."""
    fp, ce = data["fingerprint"], data["ceilings"]
    theo = fp.get("theoretical") or {}
    lines = [f"device      {fp['label']}  [{fp['key']}]",
             f"bandwidth   measured {ce['copy_bandwidth']['median_bytes_per_s'] / 1e9:.1f} GB/s"
             + (f", theoretical {theo['bandwidth_bytes_per_s'] / 1e9:.0f} GB/s" if theo.get("bandwidth_bytes_per_s") else ""),
             f"matmul      measured {ce['matmul']['median_flops'] / 1e12:.3f} TFLOP/s"
             + (f", theoretical {theo['dense_bf16_flops'] / 1e12:.0f} TFLOP/s" if theo.get("dense_bf16_flops") else ""),
             f"ridge       {ce['ridge_flops_per_byte']:.1f} FLOP/byte",
             f"knee n*     {data['knee_tokens'] or '> ' + str(max(int(n) for n in data['curves']['knee_curve']))} tokens per verify pass",
             f"acceptance  {data['acceptance']['acceptance_rate'] or 0:.3f} at gamma {data['acceptance']['gamma_max']} "
             f"(per position: {', '.join(f'{a:.2f}' for a in data['acceptance']['per_position_acceptance'])})", ""]
    cl = data["classification"]
    rows = [(r["batch_size"], r["verify_cost"], "-".join(f"{x:.2f}" for x in r.get("verify_cost_ci95") or []) or "n/a",
             r["label"] + ("" if r.get("separable", True) else " (not separable at this noise)"),
             r["best_gamma"], r["best_threshold"], r["predicted_speedup"]) for r in cl["batch_sizes"]]
    lines.append(table(["batch", f"verify cost (gamma={cl['gamma_max']}+1 vs 1)", "95% CI", "label", "best gamma",
                        "best threshold", "predicted speedup"], rows))
    if cl.get("knee_tokens_ci95"):
        lines.append(f"knee n* 95% CI: {_knee_ci(cl['knee_tokens_ci95'])} tokens (bootstrap of the repeated timings)")
    return "\n".join(lines)


@main.command()
@CONFIG_OPTION
@click.option("--trials", type=click.IntRange(min=1), default=None,
              help="Override budget.n_trials (backend.n_trials with a serving-stack backend).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Override budget.timeout_s (backend.timeout_s with a serving-stack backend).")
@click.option("--storage", default=None, help="Override storage.url (any SQLAlchemy URL).")
@click.option("--study", "study_name", default=None, help="Override storage.study_name.")
@click.option("--resume", is_flag=True, help="Continue the latest study for this device, pair and workload.")
@click.option("--reprofile", is_flag=True, help="Measure the device again instead of reusing the stored profile.")
@click.option("--backend", type=click.Choice(["engine", "vllm", "llamacpp"]), default=None,
              help="Where trials run (overrides backend.name): engine (in process), or a real vllm / llamacpp "
                   "server per trial.")
@click.option("--strict", is_flag=True, help="Refuse to store a profile measured on a busy host (exit 2).")
@click.option("--json", "as_json", is_flag=True, help="Print the stored profile as one JSON object.")
def tune(config_path, trials, timeout, storage, study_name, resume, reprofile, backend, strict, as_json):
    """The main job: profile this host, run the Optuna study, store the profile, write exports."""
    import dataclasses

    from autotune.config import load_config
    from autotune.tune import Interrupted, run_tune

    cfg = load_config(config_path)
    backend = backend or cfg.backend
    server = backend != "engine"
    overrides = {k: v for k, v in {"server_trials" if server else "n_trials": trials,
                                   "server_timeout_s" if server else "timeout_s": timeout,
                                   "study_name": study_name, "backend": backend}.items() if v is not None}
    if storage is not None:
        if "://" not in storage:
            raise click.BadParameter(f"not an SQLAlchemy URL: {storage!r}", param_hint="--storage")
        overrides["storage"] = storage
    cfg = dataclasses.replace(cfg, **overrides)
    try:
        prof = run_tune(cfg, resume=resume, reprofile=reprofile, say=_say_err, strict=strict)
    except Interrupted as exc:
        click.echo(str(exc), err=True)
        sys.exit(130)
    except KeyboardInterrupt:  # after the study (re-measuring): the trials are kept, no profile was stored
        click.echo("interrupted before the profile was stored; finished trials are kept "
                   "(`autotune tune --resume` continues)", err=True)
        sys.exit(130)
    if as_json:
        _print_json(prof)
        return
    click.echo(render_tune(prof))


def _ratio(value: float | None, ci: list | None, unit: str = "x") -> str:
    """``1.62x (95% CI 1.51-1.70)``; without an interval (old profiles, one repeat) just the value."""
    if value is None:
        return "n/a"
    if not ci or ci[0] == ci[1] == value:
        return f"{value:.2f}{unit}"
    return f"{value:.2f}{unit} (95% CI {ci[0]:.2f}-{ci[1]:.2f})"


def _with_ci(value: float, ci: list | None, fmt: str = ".1f") -> str:
    return f"{value:{fmt}}" + (f" (95% CI {ci[0]:{fmt}}-{ci[1]:{fmt}})" if ci and ci[0] != ci[1] else "")


def _class_text(r: dict) -> str:
    ci = r.get("verify_cost_ci95")
    if not ci:
        return f"B={r['batch_size']}: {r['label']}"
    sep = "" if r.get("separable", True) else " (not separable at this noise)"
    return f"B={r['batch_size']}: {r['label']}{sep} [cost {r['verify_cost']:.2f}, 95% CI {ci[0]:.2f}-{ci[1]:.2f}]"


def _knee_ci(ci: list) -> str:
    return "-".join("not bent" if n is None else str(n) for n in ci)


def _schedule_text(e: dict) -> str:
    text = f"B={e['batch_size']}: gamma {e['gamma']}"
    if "ratio" not in e:
        return text
    from autotune.stats import Estimate, describe_difference

    r = e["ratio"]
    return text + f" (speculation vs gamma 0: {describe_difference(Estimate(r['value'], *r['ci95'], r.get('n', 2)))})"


def render_tune(p: dict) -> str:
    m, c = p["metrics"], p["chosen"]
    lat = m["latency_metric"]
    backend = p.get("backend") or {"name": "engine"}
    measured_by = backend["name"] + (f" {backend['version']}" if backend.get("version") else "")
    lines = [
        f"profile #{p.get('id')} for {p['device']['label']} ({p['study']['n_trials']} trials on {measured_by}, "
        f"study {p['study']['name']})",
        f"chosen      drafter={c['drafter']} gamma={c['gamma']} threshold={c['confidence_threshold']:.2f} "
        f"schedule={c['gamma_schedule']} max_batch_size={c['max_batch_size']}  ({p['selection']['reason']})",
        "",
    ]
    rows = []
    for b, lv in sorted(m["per_level"].items(), key=lambda kv: int(kv[0])):
        base = p["baseline"]["per_level"].get(b) or p["baseline"]["per_level"].get(str(b)) or {}
        ratio = (m.get("per_level_speedup") or {}).get(b) or (m.get("per_level_speedup") or {}).get(str(b))
        rows.append((b, lv["tokens_per_second"], base.get("tokens_per_second"),
                     _ratio(ratio["value"], ratio["ci95"]) if ratio else
                     lv["tokens_per_second"] / base["tokens_per_second"] if base.get("tokens_per_second") else None,
                     lv["tpot_ms_p50"], lv["tpot_ms_p95"], lv["ttft_ms_p95"], lv["e2e_ms_p95"], lv["acceptance_rate"]))
    lines.append(table(["load", "tok/s", "AR tok/s", "speedup", "tpot p50", "tpot p95", "ttft p95", "e2e p95",
                        "acceptance"], rows))
    lines += ["",
              f"overall     {_with_ci(m['tokens_per_second'], m.get('tokens_per_second_ci95'))} tok/s, "
              f"{lat} {_with_ci(m['latency_ms'], m.get('latency_ms_ci95'))} ms"
              + (f"; medians of {m['repeats']} repeats ({(p.get('remeasure') or {}).get('order', 'interleaved')})"
                 if m.get("repeats") else ""),
              f"speedup     {_ratio(m['speedup'], m.get('speedup_ci95'))} over AR"
              + ("; it is the best static-gamma configuration" if m.get("chosen_is_best_static")
                 else f", {_ratio(m['speedup_over_best_static'], m.get('speedup_over_best_static_ci95'))} over the "
                      "best static-gamma configuration (paired re-measurements)"
                 if m.get("speedup_over_best_static") else ""),
              "classes     " + ", ".join(_class_text(r) for r in p["classification"]["batch_sizes"])
              + f"; knee n* = {p['knee_tokens']}"
              + (f" (95% CI {_knee_ci(p['classification']['knee_tokens_ci95'])})"
                 if p["classification"].get("knee_tokens_ci95") else ""),
              "schedule    " + ", ".join(_schedule_text(e) for e in p["schedule"])
              + (f"; speculation off from batch size {p['crossover_batch_size']}" if p["crossover_batch_size"] else
                 "; speculation pays at every measured batch size"),
              f"stored      profile #{p.get('id')} in {p['study']['storage']}"]
    if p["study"].get("provisional"):
        lines.insert(-1, f"budget      PROVISIONAL: budget.timeout_s stopped the study after {p['study']['trials_run']} of "
                         f"{p['study']['trials_planned']} trials; more trials (`autotune tune --resume`) may change it")
    noise = p.get("host_noise")
    if noise:
        worst = max((n for n in (noise.get("before"), noise.get("after")) if n), key=lambda n: n["cv"], default=None)
        if worst is not None:
            lines.insert(-1, "host        " + ("BUSY: " + "; ".join(worst["reasons"]) if noise["busy"] else
                                                 f"quiet (reference CV up to {worst['cv']:.1%})"))
    if p.get("exports"):
        lines.append("exports     " + ", ".join(p["exports"]))
    return "\n".join(lines)


from autotune import cli_profiles  # noqa: E402,F401  (registers profiles/export/report on `main`)
