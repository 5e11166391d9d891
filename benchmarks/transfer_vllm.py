"""Inside vLLM: the engine-tuned export, the vLLM-tuned choice, popular defaults and a grid of K.

One run, one vLLM server per configuration (the vllm backend's launcher, the same host flags,
a fresh server each), the same prompts and load (the workload of ``--config``, default the
bundled tune.yaml), in this order:

1. vLLM without speculation (measured again at the end: the drift check);
2. popular defaults: draft_model K=3 and K=5;
3. the config exported by ``autotune tune --backend engine`` (the newest engine-backend profile
   for this host and pair, exported by the vLLM exporter, per-batch-size table included);
4. the config chosen by ``autotune tune --backend vllm`` (the newest vllm-backend profile);
5. a grid of K = 1..8 (draft_model; configurations already measured above are not run twice).

Each server runs every load level of the workload ``--repeats`` times after a warm-up;
reported per configuration: median tokens/s (min-max over repeats), ratios to no speculation
and to the grid's best (median over repeats, same server), acceptance, and whether greedy
outputs equal the no-speculation server's token for token. Goals of the vLLM issue: the
vllm-backend choice within 5% of the grid's best and >= 1.2x over no speculation; the
engine-backend export's ratio to the grid's best is the tool's transfer error. Usage::

    python benchmarks/transfer_vllm.py [--config tune.yaml] [--repeats 3] [--grid 1,2,3,4,5,6,7,8]
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autotune import context  # noqa: E402
from autotune.backends.server import ServerError  # noqa: E402
from autotune.backends.vllm import VllmBackend, serve_command, trial_inputs  # noqa: E402
from autotune.config import load_config  # noqa: E402
from autotune.errors import USER_ERRORS  # noqa: E402
from autotune.table import table  # noqa: E402
from profiles.profile import export_inputs  # noqa: E402


def newest_profile(ctx, backend: str, profile_id: int | None) -> dict | None:
    """The given profile, or the newest one for this host and pair that ``backend`` measured."""
    if profile_id is not None:
        return ctx.store.get_profile(profile_id)
    for row in ctx.store.list_profiles():
        if row["backend"] != backend:
            continue
        prof = ctx.store.get_profile(row["id"])
        if (prof["device"]["key"] == ctx.device_key and prof["pair"]["target_hash"] == ctx.target_hash
                and prof["pair"].get("draft_hash") == ctx.draft_hash):
            return prof
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=ROOT / "tune.yaml")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--grid", default="1,2,3,4,5,6,7,8")
    p.add_argument("--engine-profile", type=int, default=None, help="profile id (default: newest engine-backend one)")
    p.add_argument("--vllm-profile", type=int, default=None, help="profile id (default: newest vllm-backend one)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "transfer_vllm.json")
    args = p.parse_args()
    try:
        cfg = load_config(args.config)
        ctx = context.build(cfg)
        backend = VllmBackend(ctx)
        engine_prof = newest_profile(ctx, "engine", args.engine_profile)
        vllm_prof = newest_profile(ctx, "vllm", args.vllm_profile)
    except USER_ERRORS as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        sys.exit(2)
    batch = max(cfg.max_batch_size)
    fp = ctx.fingerprint

    def grid_command(k: int) -> list[str]:
        params = {"drafter": "model" if k else "none", "gamma": k, "max_batch_size": batch}
        return serve_command(backend.python, cfg, trial_inputs(cfg, fp, params))

    def profile_command(prof: dict) -> list[str]:
        return serve_command(backend.python, cfg, export_inputs(prof))

    plan: list[tuple[str, list[str]]] = [("no speculation", grid_command(0)), ("default K=3", grid_command(3)),
                                         ("default K=5", grid_command(5))]
    if engine_prof is not None:
        plan.append((f"engine-backend export (profile #{engine_prof['id']})", profile_command(engine_prof)))
    else:
        print("note: no engine-backend profile for this host and pair (run `autotune tune`)", file=sys.stderr)
    if vllm_prof is not None:
        plan.append((f"vllm-backend choice (profile #{vllm_prof['id']})", profile_command(vllm_prof)))
    else:
        print("note: no vllm-backend profile for this host and pair (run `autotune tune --backend vllm`)",
              file=sys.stderr)
    grid = [int(k) for k in args.grid.split(",")]
    plan += [(f"grid K={k}", grid_command(k)) for k in grid]
    plan.append(("no speculation (again, last)", grid_command(0)))

    measured: dict[str, dict] = {}
    rows = []
    t_start = time.perf_counter()
    for label, command in plan:
        key = json.dumps(command[2:])
        if key in measured and not label.startswith("no speculation"):
            rows.append({"config": label, **measured[key], "same_as": measured[key]["config"]})
            continue
        backend.close()  # a fresh server for every configuration
        records: dict = {}
        tps, runs = [], []
        try:
            for r in range(args.repeats):
                res = backend.run(command, batch, cfg.seed + r, records if r == 0 else None)
                tps.append(res["tokens_per_second"])
                runs.append(res)
        except ServerError as exc:
            print(f"{label}: failed: {exc}", file=sys.stderr)
            rows.append({"config": label, "error": str(exc)[:2000], "serve_args": shlex.join(command[2:])})
            continue
        first_level = min(records)
        entry = {
            "config": label, "serve_args": shlex.join(command[2:command.index("--host")]),
            "startup_s": backend.server.startup_s, "tokens_per_second_runs": tps,
            "tokens_per_second": statistics.median(tps), "min": min(tps), "max": max(tps),
            "acceptance_rate": runs[-1]["per_level"][first_level]["acceptance_rate"],
            "per_level": runs[-1]["per_level"],
            "outputs": [r.output_tokens for r in records[first_level]],
        }
        measured[key] = entry
        rows.append(entry)
        print(f"{label}: {entry['tokens_per_second']:.1f} tok/s ({entry['min']:.1f}-{entry['max']:.1f}), "
              f"start-up {entry['startup_s']:.0f} s", file=sys.stderr)
    backend.close()

    base = next((r for r in rows if r["config"] == "no speculation" and "error" not in r), None)
    ok = [r for r in rows if "error" not in r and r["config"].startswith("grid")]
    best = max(ok, key=lambda r: r["tokens_per_second"], default=None)
    for r in rows:
        if "error" in r:
            continue
        r["over_no_speculation"] = r["tokens_per_second"] / base["tokens_per_second"] if base else None
        r["over_grid_best"] = r["tokens_per_second"] / best["tokens_per_second"] if best else None
        if base and cfg.temperature == 0:
            r["greedy_identical"] = r["outputs"] == base["outputs"]
    summary = {
        "grid_best": best["config"] if best else None,
        "engine_export_over_grid_best": next((r["over_grid_best"] for r in rows if r["config"].startswith("engine")
                                              and "error" not in r), None),
        "vllm_choice_over_grid_best": next((r["over_grid_best"] for r in rows if r["config"].startswith("vllm")
                                            and "error" not in r), None),
        "vllm_choice_over_no_speculation": next((r["over_no_speculation"] for r in rows
                                                 if r["config"].startswith("vllm") and "error" not in r), None),
        "drift_no_speculation_last_over_first": (rows[-1]["tokens_per_second"] / base["tokens_per_second"]
                                                 if base and "error" not in rows[-1] else None),
    }
    result = {"command": shlex.join([sys.executable, *sys.argv]), "device": fp["label"], "config": str(args.config),
              "vllm_version": backend.version, "workload": ctx.workload, "max_num_seqs": batch,
              "repeats": args.repeats, "wall_s": time.perf_counter() - t_start,
              "engine_profile": engine_prof and {"id": engine_prof["id"], "chosen": engine_prof["chosen"],
                                                 "schedule": engine_prof["schedule"]},
              "vllm_profile": vllm_prof and {"id": vllm_prof["id"], "chosen": vllm_prof["chosen"],
                                             "schedule": vllm_prof["schedule"]},
              "summary": summary, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(f".{args.out.name}.tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(args.out)
    print(f"\nvLLM {backend.version} on {fp['label']}; workload {cfg.prompts.name}, concurrency "
          f"{list(cfg.concurrency)}, {cfg.num_requests} requests x {cfg.max_new_tokens} tokens per level, "
          f"{args.repeats} repeats per server; --max-num-seqs {batch}\n")
    print(table(["configuration", "tok/s (median)", "min", "max", "x no-spec", "x grid best", "acceptance",
                 "greedy = no-spec", "start-up s"],
                [(r["config"], r.get("tokens_per_second"), r.get("min"), r.get("max"), r.get("over_no_speculation"),
                  r.get("over_grid_best"), r.get("acceptance_rate"), r.get("greedy_identical"), r.get("startup_s"))
                 for r in rows]))
    print("\n" + "\n".join(f"{k}: {v:.3f}" if isinstance(v, float) else f"{k}: {v}" for k, v in summary.items()))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
