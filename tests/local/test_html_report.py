"""The scenarios' HTML report: one self-contained page whose every plot a real browser renders.

The page is opened in headless Chromium (what ``make install`` provides): its DOM after load says
how many of the embedded plots the browser decoded, and a screenshot of it must show something.
"""

from __future__ import annotations

import base64
import json
import random
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import matplotlib.image
import pytest

from local.scenarios.html_report import write_html_report

# The names Chromium's packages give its binary (Debian: chromium; others: chromium-browser, Chrome's).
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium() -> str:
    for name in CHROMIUM_NAMES:
        if found := shutil.which(name):
            return found
    pytest.fail(
        f"no Chromium on the PATH (looked for {', '.join(CHROMIUM_NAMES)}): `make install` installs "
        "Debian's chromium package, which this test needs to render the HTML report",
        pytrace=False,
    )


def run_chromium(profile: Path, *args: str) -> str:
    """Chromium headless on ``args``; its stdout. A profile of its own, so runs never share one."""
    done = subprocess.run(  # noqa: S603 - the binary found on the PATH, fixed arguments
        [
            chromium(),
            "--headless",
            "--disable-gpu",
            "--no-sandbox",  # the tests may run as root, which Chromium's sandbox refuses
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def config(name: str, kind: str, seed: int, **extra: Any) -> dict[str, Any]:
    """One configuration's report, as the demo writes it, with enough rows to plot."""
    draw = random.Random(seed)
    scenario = {"kind": kind, "tenants": 5, "baseline_s": 10.0, "burst_s": 10.0, "after_s": 10.0}
    first_attempts = [
        [round(i * 0.1, 3), f"tenant-0{1 + i % 5}", round(draw.uniform(5, 5000), 1), "live"]
        for i in range(300)
    ]
    depths = [[float(t), draw.randint(0, 50), draw.randint(0, 20), t // 10] for t in range(31)]
    group = {
        "accepted": 120,
        "age_p50_ms": 40.0,
        "age_p99_ms": 900.0,
        "age_p99_before_burst_ms": 300.0,
        "age_p99_during_burst_ms": 600.0,
    }
    return {
        "config": name,
        "scenario": scenario,
        "groups": {"noisy": {**group, "accepted": 240}, "quiet": group},
        "accounting": {"accepted": 360, "processed": 350, "in_dlq": 10, "unaccounted": 0},
        "quiet_p99_ratio": 2.0,
        "series": {"first_attempts": first_attempts, "depths": depths},
        **extra,
    }


def write_reports(out: Path) -> None:
    """The noisy scenario at the root (as the demo keeps it), an outage with its figures and alarms."""
    out.mkdir(parents=True, exist_ok=True)
    noisy = [config("breakwater", "noisy", 1), config("naive", "noisy", 2)]
    (out / "report.json").write_text(json.dumps(noisy), encoding="utf-8")
    alarm = {"alarm": "LiveAgeP99", "description": "p99 age", "state": "ALARM", "at_s": 14.0, "value": 2.5}
    outage = [
        config(
            name,
            "outage",
            seed,
            fresh_recovery_s=3.0,
            drain_s=None,
            peak_backlog=80,
            alarms_fired=[alarm, {**alarm, "state": "OK", "at_s": 25.0}],
        )
        for seed, name in enumerate(("breakwater", "naive"), start=3)
    ]
    (out / "outage").mkdir()
    (out / "outage" / "report.json").write_text(json.dumps(outage), encoding="utf-8")


class RenderStatus(HTMLParser):
    """The attributes and text of the page's ``#render-status`` element."""

    def __init__(self) -> None:
        super().__init__()
        self.attrs: dict[str, str | None] = {}
        self.text = ""
        self._inside = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if dict(attrs).get("id") == "render-status":
            self.attrs, self._inside = dict(attrs), True

    def handle_endtag(self, tag: str) -> None:
        self._inside = False

    def handle_data(self, data: str) -> None:
        if self._inside:
            self.text += data


def test_every_plot_of_the_report_renders_in_chromium(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write_reports(out)

    page = write_html_report(out)

    assert page == out / "report.html"
    assert (out / "timeline.png").is_file() and (out / "outage" / "timeline.png").is_file()
    html = page.read_text(encoding="utf-8")
    plots = html.count('<img src="data:image/png;base64,')
    assert plots == 2  # one per scenario found
    assert "http://" not in html and "https://" not in html  # nothing loaded from elsewhere

    dom = run_chromium(tmp_path / "profile", "--virtual-time-budget=10000", "--dump-dom", page.as_uri())
    status = RenderStatus()
    status.feed(dom)
    assert status.attrs.get("data-images") == str(plots), dom[:2000]
    assert status.attrs.get("data-rendered") == str(plots)
    assert status.text.strip() == f"{plots} of {plots} plots rendered"

    shot = tmp_path / "report.png"
    run_chromium(tmp_path / "profile", "--window-size=1400,2000", f"--screenshot={shot}", page.as_uri())
    pixels = matplotlib.image.imread(str(shot))[..., :3]
    assert pixels.shape[0] > 100 and pixels.shape[1] > 100
    background = (pixels > 0.97).all(axis=-1).mean()
    assert background < 0.99, "the screenshot is (almost) blank"
    # Text and tables are black and grey; colour comes from the plots' points and lines.
    coloured = ((pixels.max(axis=-1) - pixels.min(axis=-1)) > 0.3).mean()
    assert coloured > 0.002, "no plot is painted in the screenshot"


def test_the_page_shows_what_a_report_has_and_flags_unaccounted_messages(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "poison").mkdir(parents=True)
    # A bare report: none of the optional figures, alarms or kind; messages lost in the accounting.
    bare = config("naive", "poison", 5, in_dlq=7, poison_sent=9)
    del bare["scenario"]["kind"], bare["quiet_p99_ratio"]
    bare["accounting"]["unaccounted"] = 4
    (out / "poison" / "report.json").write_text(json.dumps([bare]), encoding="utf-8")

    html = write_html_report(out).read_text(encoding="utf-8")

    assert 'id="scenario-poison"' in html and 'id="scenario-noisy"' not in html
    assert "in DLQ 7 of 9 poison sent" in html  # the kind comes from where the report lies
    assert '<td>unaccounted</td><td class="bad">4</td>' in html
    assert "alarms: not recorded in this report" in html
    assert (out / "poison" / "timeline.png").is_file()


def test_an_up_to_date_timeline_is_embedded_as_it_is(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write_reports(out)
    write_html_report(out)
    drawn = (out / "timeline.png").read_bytes()
    (out / "timeline.png").write_bytes(drawn + b"kept")  # newer than its report: not drawn again

    html = write_html_report(out).read_text(encoding="utf-8")

    assert base64.b64encode(drawn + b"kept").decode("ascii") in html


def test_no_report_is_an_error_that_says_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"report\.json"):
        write_html_report(tmp_path)


def test_each_scenario_has_its_configurations_side_by_side_with_the_measures(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    measures = {
        "naive": {"quiet_p99_max_ratio": 40.0, "noisy_fresh_p99_ms": 31_000.0, "usd_per_million": 9.5},
        "fair": {"quiet_p99_max_ratio": 2.5, "noisy_fresh_p99_ms": 30_000.0, "usd_per_million": 9.75},
        "breakwater": {"quiet_p99_max_ratio": 1.25, "noisy_fresh_p99_ms": 800.0, "usd_per_million": 19.0},
    }
    reports = [
        config(name, "noisy", seed, quiet_p99_max_window_s=10.0, freshness_s=30.0, drain_s=None, **figures)
        for seed, (name, figures) in enumerate(measures.items())
    ]
    (out / "report.json").write_text(json.dumps(reports), encoding="utf-8")

    html = write_html_report(out).read_text(encoding="utf-8")

    table = html[html.index('<table class="comparison">') :]
    table = table[: table.index("</table>")]
    assert "<th>what sets them apart</th><th>naive</th><th>fair</th><th>breakwater</th></tr>" in table
    assert (
        "<tr><td>quiet p99 age, worst 10 s / before</td><td>40.00x</td><td>2.50x</td><td>1.25x</td></tr>"
        in table
    )
    assert "<td>31,000 ms</td><td>30,000 ms</td><td>800 ms</td>" in table
    assert "<td>$9.50</td><td>$9.75</td><td>$19.00</td>" in table
    assert "<td>backlog drained after the event</td>" + "<td>not within the run</td>" * 3 in table
    assert "stale work run (older than 30 s)" in table
