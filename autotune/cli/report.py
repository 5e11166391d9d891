"""``autotune report``: PNG plots of a profile, a short Markdown summary linking them, and with
``--html`` one self-contained page (the same summary, the PNGs embedded as data URIs).

The plots are :mod:`autotune.cli.plots`; the ones a profile lacks the data for (a served table,
a re-measurement, per-position acceptance) are left out of the folder and of both summaries.
matplotlib is an optional extra (``pip install 'spec-autotune[plot]'``); without it the command
stops with a one-line message saying so. The profile arrives typed
(:class:`profiles.schema.Profile`; the stored JSON of one is read with ``Profile.from_json``).
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.cli.plots import (
    plot_acceptance,
    plot_pareto,
    plot_speedup_by_level,
    plot_table_vs_constant,
    plot_throughput_by_batch,
    plot_verify_cost,
)
from profiles.schema import MISSING, Profile


@dataclass(frozen=True)
class Figure:
    """One picture of the report: its file name, its caption, and the function that draws it
    (None: it always draws; a bool: False when the profile lacks its data)."""

    name: str
    caption: str
    draw: Callable[[Profile, Path], bool | None]


FIGURES = (
    Figure("pareto.png", "Pareto front", plot_pareto),
    Figure("speedup_by_level.png", "Speedup over no speculation per load level", plot_speedup_by_level),
    Figure("table_vs_constant.png", "Served table against the best constant", plot_table_vs_constant),
    Figure("acceptance.png", "Acceptance per position", plot_acceptance),
    Figure("throughput_by_batch.png", "Throughput by batch size", plot_throughput_by_batch),
    Figure("verify_cost.png", "Verify cost and knee", plot_verify_cost),
)
"""The report's pictures in the order the summaries show them."""


def _profile(profile: Profile | Mapping[str, Any]) -> Profile:
    return profile if isinstance(profile, Profile) else Profile.from_json(profile)


def draw_figures(profile: Profile, folder: Path) -> list[Figure]:
    """Write every figure the profile has the data for into ``folder``; the ones written, in order."""
    written = []
    for fig in FIGURES:
        if fig.draw(profile, folder / fig.name) is not False:
            written.append(fig)
    return written


def summary_lines(profile: Profile) -> list[str]:
    """The summary's bullet points, in Markdown (backticks and ``**`` only)."""
    c, m = profile.chosen, profile.metrics
    sched = ", ".join(f"B={e.batch_size}: {e.gamma}" for e in profile.schedule.entries)
    crossover = profile.schedule.crossover_batch_size
    stack = (profile.backend or {}).get("name", "engine")
    where = "engine" if stack == "engine" else f"{stack} server"
    lines = [
        f"Chosen: drafter `{c.drafter}`, gamma **{c.gamma}**, confidence threshold "
        f"{c.confidence_threshold:.2f}, schedule `{c.gamma_schedule}`, max batch size {c.max_batch_size}"
        f" ({profile.selection['reason']}).",
        f"Throughput {m['tokens_per_second']:.1f} tokens/s, {m['latency_metric']} {m['latency_ms']:.1f} ms; "
        f"speedup {m['speedup']:.2f}x over autoregressive decoding on the same {where} and load.",
        f"Gamma by batch size: {sched}"
        + (f"; speculation off from batch size {crossover}." if crossover else "."),
        f"Knee n* = {None if profile.knee_tokens is MISSING else profile.knee_tokens} tokens per verify pass.",
    ]
    decision = profile.table_decision
    if decision is not MISSING and decision.reason:
        lines.append(f"Table contest: {decision.reason}.")
    return lines


def _title(profile: Profile) -> str:
    return (
        f"spec-autotune profile #{None if profile.id is MISSING else profile.id}: {profile.device['label']}"
    )


def render_markdown(profile: Profile, figures: list[Figure]) -> str:
    """report.md: the title, the summary and the written figures, linked by file name."""
    bullets = "".join(f"- {line}\n" for line in summary_lines(profile))
    images = "\n\n".join(f"![{fig.caption}]({fig.name})" for fig in figures)
    return f"# {_title(profile)}\n\n{bullets}\n{images}\n"


_INLINE = (
    (re.compile(r"`([^`]+)`"), r"<code>\1</code>"),
    (re.compile(r"\*\*([^*]+)\*\*"), r"<strong>\1</strong>"),
)

_STYLE = (
    "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;max-width:1180px;margin:2em auto;"
    "padding:0 1em;color:#222;line-height:1.45}h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.6em}"
    "code{background:#f2f2f2;padding:0 .25em;border-radius:3px}img{max-width:100%;border:1px solid #ddd}"
    "figure{margin:1em 0}figcaption{color:#555;font-size:.9em}"
)


def _inline_html(line: str) -> str:
    out = html.escape(line, quote=False)
    for pattern, repl in _INLINE:
        out = pattern.sub(repl, out)
    return out


def render_html(profile: Profile, figures: list[Figure], folder: Path) -> str:
    """report.html: the summary of report.md and every written figure as a base64 PNG data URI, so
    the page opens anywhere on its own."""
    title = html.escape(_title(profile))
    items = "".join(f"<li>{_inline_html(line)}</li>\n" for line in summary_lines(profile))
    blocks = []
    for fig in figures:
        data = base64.b64encode((folder / fig.name).read_bytes()).decode("ascii")
        caption = html.escape(fig.caption)
        blocks.append(
            f'<figure id="{fig.name[:-4]}">\n<h2>{caption}</h2>\n'
            f'<img alt="{caption}" src="data:image/png;base64,{data}">\n</figure>\n'
        )
    return (
        f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{title}</title>\n'
        f"<style>{_STYLE}</style>\n</head>\n<body>\n<h1>{title}</h1>\n<ul>\n{items}</ul>\n"
        + "".join(blocks)
        + "</body>\n</html>\n"
    )


def write_report(profile: Profile | Mapping[str, Any], folder: Path, page: bool = False) -> list[Path]:
    """Write the figures and report.md into ``folder`` (and report.html when ``page``); the
    summaries written, report.md first."""
    profile = _profile(profile)
    folder.mkdir(parents=True, exist_ok=True)
    figures = draw_figures(profile, folder)
    md = folder / "report.md"
    md.write_text(render_markdown(profile, figures), encoding="utf-8")
    if not page:
        return [md]
    out = folder / "report.html"
    out.write_text(render_html(profile, figures, folder), encoding="utf-8")
    return [md, out]
