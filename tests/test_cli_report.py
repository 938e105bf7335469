"""'pilot report' of a real run on a real local pilot, opened in headless Chromium (Debian's package):
the page it renders shows its plots (each decoded by the browser) and lists the failure."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from pilot_waits import agents_active

PYTHON = sys.executable
TWO = '[allocation]\nlrm = "local"\nnodes = 2\ncores_per_node = 1\n'
PNG = b"\x89PNG\r\n\x1a\n"
CHROMIUM = shutil.which("chromium")
# Runs in the page at its load event (every image loaded, or failed): the size the browser found in each
# (a broken image has none).
PROBE = """<script>
window.addEventListener("load", () => {
  const p = document.createElement("pre"); p.id = "probe";
  p.textContent = [...document.images].map(i => i.naturalWidth + "x" + i.naturalHeight).join(" ");
  document.body.append(p);
});
</script></body>"""

pytestmark = pytest.mark.timeout(180)


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "pilot", *args], env=dict(os.environ), capture_output=True, text=True, timeout=120, cwd=cwd
    )


class Page(HTMLParser):
    """The img elements and the failure table's cells of a DOM."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[dict[str, str]] = []
        self.cells: list[str] = []
        self._in_cell = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "img":
            self.images.append({k: v or "" for k, v in attrs})
        self._in_cell = tag == "td"

    def handle_data(self, data: str) -> None:
        if self._in_cell:
            self.cells.append(data.strip())


def chromium(*args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", *args],
        capture_output=True,
        text=True,
        timeout=90,
    )


@pytest.fixture
def a_run(start_pilot: Any) -> tuple[str, str]:
    """Four jobs on a real pilot, job 3 failing, each asking 64 MiB; the pilot then stopped."""
    pilot = start_pilot(TWO)
    agents_active(pilot.executor(), 2)
    rd = str(pilot.rundir.path)
    proc = cli(
        "submit", "--rundir", rd, "--array", "1-4", "--memory", "64M", "--wait", "--",
        "/bin/sh", "-c", "sleep 0.{i}; exit $(( {i} == 3 ))",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    run = proc.stdout.split(":")[0]
    rows = json.loads(cli("history", "--rundir", rd, "--json", "--run", run).stdout)
    assert [(r["id"], r["memory"]) for r in rows] == [(str(i), 64 * 2**20) for i in range(1, 5)]
    assert all("delivered" not in r for r in rows)  # 'pilot history' of a running pilot: the summary rows
    live = cli("report", "--rundir", rd, "--json", "--output", str(Path(rd).parent / "live"))
    assert live.returncode == 0, live.stderr  # while the pilot runs: its latest run, from the daemon
    assert json.loads(live.stdout)["run"] == run
    # A run id is whatever a client set: one that reads as a path must not make the report's folder one.
    odd = cli("submit", "--rundir", rd, "--run", "../odd run", "--wait", "--", "/bin/true")
    assert odd.returncode == 0, odd.stderr
    assert cli("down", "--rundir", rd).returncode == 0
    return rd, run


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/tools.sh installs Debian's)")
def test_report_opens_in_chromium_with_its_plots(a_run: tuple[str, str], tmp_path: Path) -> None:
    rd, run = a_run
    out = tmp_path / "report"
    proc = cli("report", run, "--rundir", rd, "--output", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    made = json.loads(proc.stdout)
    assert made["states"] == {"COMPLETED": 3, "FAILED": 1} and made["html"] == str(out / "report.html")
    names = ["utilization", "timeline", "queue", "rate", "delivered"]
    assert made["pngs"] == [str(out / f"{n}.png") for n in names]

    dom = chromium("--dump-dom", str(out / "report.html"))
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = Page()
    page.feed(dom.stdout)
    assert [img["alt"] for img in page.images] == [
        "Utilization over time per node",
        "Per-task timeline",
        "Queue depth over time",
        "Tasks per second",
        "Delivered vs Requested per job",
    ]
    for img, name in zip(page.images, names, strict=True):
        prefix = "data:image/png;base64,"
        assert img["src"].startswith(prefix)
        data = base64.b64decode(img["src"].removeprefix(prefix), validate=True)
        assert data.startswith(PNG) and len(data) > 5000  # a drawn plot, not an empty image
        assert data == (out / f"{name}.png").read_bytes()  # the PNG beside it is the same picture
    assert page.cells[:2] == ["3", "/bin/sh"] and "exited with code 1" in page.cells[5], page.cells
    assert "1 FAILED" in dom.stdout and "3 COMPLETED" in dom.stdout

    # The browser decodes every plot ...
    probe = out / "probe.html"
    probe.write_text((out / "report.html").read_text().replace("</body>", PROBE))
    probed = chromium("--dump-dom", str(probe))
    sizes = re.search(r'<pre id="probe">([^<]*)</pre>', probed.stdout)
    assert sizes is not None, probed.stdout[-2000:]
    assert len(sizes.group(1).split()) == 5 and all(
        int(w) > 500 and int(h) > 200 for w, h in (s.split("x") for s in sizes.group(1).split())
    ), sizes.group(1)

    # ... and paints them: the screenshot of the page is far from blank, with the failed job's red in it.
    shot = tmp_path / "shot.png"
    painted = chromium(f"--screenshot={shot}", "--window-size=1100,3200", str(out / "report.html"))
    assert painted.returncode == 0 and shot.exists(), painted.stderr[-2000:]
    from PIL import Image

    image = Image.open(io.BytesIO(shot.read_bytes())).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 20) or []
    assert len(colours) > 50, "the page looks blank"
    assert any(n > 20 for n, (r, g, b) in colours if (r, g, b) == (0xC6, 0x28, 0x28)), "no failed job drawn in red"


def test_report_of_an_unknown_run_names_the_runs_kept(a_run: tuple[str, str], tmp_path: Path) -> None:
    rd, run = a_run
    proc = cli("report", "run-nope", "--rundir", rd, "--output", str(tmp_path / "r"))
    assert proc.returncode == 1 and "no job of run 'run-nope'" in proc.stderr and run in proc.stderr
    assert not (tmp_path / "r").exists()
    here = tmp_path / "here"
    here.mkdir()
    odd = cli("report", "../odd run", "--rundir", rd, cwd=here)
    assert odd.returncode == 0, odd.stderr
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("pilot-report")] == []
    assert [p.name for p in here.iterdir()] == ["pilot-report-_odd_run"]
    assert (here / "pilot-report-_odd_run" / "report.html").is_file()
    both = cli("report", run, "--all", "--rundir", rd)
    assert both.returncode == 2 and "not both" in both.stderr


def test_report_before_any_history_says_so(pilot_home: Path) -> None:
    proc = cli("report", "--rundir", str(pilot_home / "fresh"))
    assert proc.returncode == 1 and "no job history in" in proc.stderr and "Traceback" not in proc.stderr
