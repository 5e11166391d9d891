"""`autotune report` on a stored stack profile: the PNGs, report.md and the self-contained report.html.

The profile is tests/profiles/data/stored_v1_vllm.json (a vLLM study with a re-measurement and a
served table), stored in a fresh SQLite store and read back through the command, as a user would.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from autotune.cli import main
from autotune.cli.report import FIGURES, write_report
from profiles.schema import Profile
from profiles.store import Store

pytest.importorskip("matplotlib")

STORED = Path(__file__).parent / "profiles" / "data" / "stored_v1_vllm.json"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def stored() -> dict:
    data = json.loads(STORED.read_text(encoding="utf-8"))
    data.pop("id", None)
    return data


def run_report(tmp_path: Path, *extra: str) -> tuple[int, str, Path]:
    url = f"sqlite:///{tmp_path / 'autotune.db'}"
    with Store(url) as store:
        pid = store.save_profile(stored())
    folder = tmp_path / "report"
    result = CliRunner().invoke(main, ["report", str(pid), "--storage", url, "-o", str(folder), *extra])
    return result.exit_code, result.output, folder


def test_html_page_holds_every_plot_as_the_png_written(tmp_path):
    code, out, folder = run_report(tmp_path, "--html")
    assert code == 0, out
    assert out.splitlines() == [f"wrote {folder / 'report.md'}", f"wrote {folder / 'report.html'}"]
    page = (folder / "report.html").read_text(encoding="utf-8")
    embedded = dict(re.findall(r'<figure id="([\w]+)">.*?src="data:image/png;base64,([^"]+)"', page, re.S))
    for fig in FIGURES:  # a stack profile with a re-measurement and a served table: every plot
        png = (folder / fig.name).read_bytes()
        assert png.startswith(PNG_MAGIC) and len(png) > 5000, fig.name
        assert base64.b64decode(embedded[fig.name[:-4]]) == png, fig.name
    assert "src=" not in re.sub(
        r'src="data:image/png;base64,[^"]+"', "", page
    )  # nothing fetched from outside
    assert "<strong>5</strong>" in page and "Table contest: table 1-4:5 5-16:2 vs the best constant" in page
    assert "over autoregressive decoding on the same vllm server and load" in page


def test_markdown_links_the_per_level_acceptance_and_table_plots(tmp_path):
    code, out, folder = run_report(tmp_path)
    assert code == 0 and out == f"wrote {folder / 'report.md'}\n"
    assert not (folder / "report.html").exists()
    md = (folder / "report.md").read_text(encoding="utf-8")
    for name in ("speedup_by_level.png", "acceptance.png", "table_vs_constant.png"):
        assert f"]({name})" in md and (folder / name).is_file()


def test_a_profile_file_is_reported_without_a_store(tmp_path):
    """REF may be a profile file: the JSON `profiles show --json` prints or the yaml export."""
    import yaml

    exported = tmp_path / "profile.yaml"
    exported.write_text("# profile.yaml: a header comment\n" + yaml.safe_dump(stored(), sort_keys=False))
    folder = tmp_path / "from_yaml"
    result = CliRunner().invoke(main, ["report", str(exported), "-o", str(folder), "--html"])
    assert result.exit_code == 0, result.output
    assert (folder / "table_vs_constant.png").is_file() and (folder / "report.html").is_file()
    not_a_profile = tmp_path / "notes.yaml"
    not_a_profile.write_text("- just\n- a list\n")
    result = CliRunner().invoke(main, ["report", str(not_a_profile), "-o", str(tmp_path / "x")])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert "not a profile" in result.output and not (tmp_path / "x").exists()


def test_plots_without_their_data_are_left_out(tmp_path):
    data = stored()
    for key in ("table_decision", "remeasured", "stack_cost", "acceptance"):
        del data[key]
    data["metrics"] = copy.deepcopy(data["metrics"])
    del data["metrics"]["per_level_speedup"]
    for level in data["metrics"]["per_level"].values():
        level.pop("per_position_acceptance", None)
    write_report(Profile.from_json(data), tmp_path / "schedule")  # the schedule's per-level ratios remain
    assert (tmp_path / "schedule" / "speedup_by_level.png").is_file()
    for entry in data["schedule"]:
        for key in ("ratio", "tokens_per_second", "baseline_tokens_per_second"):
            del entry[key]
    paths = write_report(Profile.from_json(data), tmp_path, page=True)
    written = {p.name for p in tmp_path.glob("*.png")}
    assert written == {"pareto.png", "throughput_by_batch.png", "verify_cost.png"}
    for path in paths:
        text = path.read_text(encoding="utf-8")
        for left_out in ("speedup_by_level", "table_vs_constant", "acceptance.png", 'id="acceptance"'):
            assert left_out not in text, (path.name, left_out)
