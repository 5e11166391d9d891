"""``autotune init``: write a commented tune.yaml."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.option(
    "--target",
    type=click.Path(path_type=Path),
    default=None,
    help="Target model folder (default: the bundled demo target, written as `demo`).",
)
@click.option(
    "--draft",
    type=click.Path(path_type=Path),
    default=None,
    help="Draft model folder (required with --target; default: the demo draft).",
)
@click.option(
    "--prompts",
    type=click.Path(path_type=Path),
    default=None,
    help="JSONL workload (default: the demo prompts, written as `demo`).",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    default=Path("tune.yaml"),
    show_default=True,
    help="Where to write the tune.yaml.",
)
@click.option(
    "--eagle3",
    type=click.Path(path_type=Path),
    default=None,
    help="An EAGLE-3 head folder; without --draft the head alone is searched (search.drafter [eagle3]).",
)
@click.option(
    "--dtype",
    type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
    default="auto",
    show_default=True,
    help="models.dtype: auto is the checkpoint's torch_dtype where the device runs it; the sweep is sized in it.",
)
@click.option("--device", default="auto", show_default=True, help="models.device: auto, cpu, cuda or cuda:N.")
@click.option(
    "--backend",
    type=click.Choice(["engine", "vllm", "llamacpp"]),
    default="engine",
    show_default=True,
    help="backend.name: where trials run.",
)
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
@click.option(
    "--sweep",
    type=click.Choice(["auto", "bundled"]),
    default="auto",
    show_default=True,
    help="auto: size the load sweep (workload.concurrency, num_requests, search.max_batch_size) on this "
    "host, from one request to where the target's decode throughput stops growing (seconds); "
    "bundled: keep the bundled tune.yaml's.",
)
def init(target, draft, prompts, output, eagle3, dtype, device, backend, force, sweep):
    """Write a commented tune.yaml for your models (the bundled one, with absolute paths)."""
    from autotune.device.sizing import Sweep, size_sweep
    from autotune.jobs.init import write_tune_yaml

    sized: list[Sweep] = []

    def measure(folder: Path) -> Sweep:
        sized.append(size_sweep(folder, device, dtype))
        return sized[-1]

    path = write_tune_yaml(
        output,
        target,
        draft,
        prompts,
        force,
        measure if sweep == "auto" else None,
        eagle3,
        dtype,
        device,
        backend,
    )
    if sized:
        click.echo(f"sweep: {sized[0].describe()}")
    click.echo(f"wrote {path}")
    click.echo(f"next: autotune tune --config {path}")
