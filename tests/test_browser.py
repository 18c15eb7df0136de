"""End to end in a real browser: Debian's Chromium driven by Playwright against `streamlit run`.

Set OMEM_SCREENSHOT_DIR to keep the screenshots (the README's come from this test).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[dev]')")
if not os.path.exists(CHROMIUM):
    pytest.skip("Debian's chromium is not installed (apt-get install -y chromium); .ci/run installs it",
                allow_module_level=True)

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server(tmp_path):
    port = free_port()
    env = {**os.environ, "OMEM_DB": str(tmp_path / "e2e.duckdb"), "OMEM_CACHE_DIR": str(tmp_path / "cache")}
    process = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"), "--server.headless", "true",
         "--server.address", "127.0.0.1", "--server.port", str(port), "--browser.gatherUsageStats", "false"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                    break
            except OSError:
                time.sleep(0.3)
        else:
            raise RuntimeError("streamlit did not become healthy in 60 s")
        yield url, tmp_path
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


@contextlib.contextmanager
def chromium(profile: Path, width: int = 1500, height: int = 1100):
    """A page in Debian's Chromium (headless, no network side traffic), closed afterwards."""
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(str(profile), executable_path=CHROMIUM, args=ARGS,
                                                       viewport={"width": width, "height": height})
        try:
            yield browser.new_page()
        finally:
            browser.close()


def settle(page) -> None:
    page.wait_for_timeout(300)
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=90_000)
    page.wait_for_timeout(500)


def wait_for_charts(page, count: int) -> int:
    """Plotly draws after the script finishes: wait (bounded) until ``count`` charts are on the page."""
    page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot').length >= {count}", timeout=60_000)
    return page.locator(".js-plotly-plot").count()


def test_replay_slider_compare_and_screenshots(server) -> None:
    url, tmp = server
    shots = Path(os.environ.get("OMEM_SCREENSHOT_DIR") or tmp)
    shots.mkdir(parents=True, exist_ok=True)
    with chromium(tmp / "profile") as page:
        page.goto(url)
        settle(page)
        # A fresh store: the explorer replayed the demo conversation on the built-in model.
        page.get_by_role("heading", name=re.compile(r"^At step \d+")).first.wait_for(timeout=90_000)
        assert page.get_by_text("priya-lisbon").count() > 0
        compression = page.locator('[data-testid="stMetric"]').filter(has_text="Compression")
        assert compression.locator('[data-testid="stMetricValue"]').text_content().strip().endswith("x")
        assert wait_for_charts(page, 3) >= 3
        last_step = page.get_by_role("heading", name=re.compile(r"^At step \d+")).first.inner_text()
        page.screenshot(path=str(shots / "explorer.png"), full_page=False)

        # Move the step slider with the keyboard: the step panel follows.
        slider = page.get_by_role("slider").first
        slider.focus()
        for _ in range(5):
            slider.press("ArrowLeft")
        # (the rerun may start after a first settle on a loaded machine: wait, bounded, for the panel)
        playwright.expect(page.get_by_role("heading", name=re.compile(r"^At step \d+")).first).not_to_have_text(
            last_step, timeout=30_000)
        settle(page)
        moved = page.get_by_role("heading", name=re.compile(r"^At step \d+")).first.inner_text()
        assert moved != last_step and int(moved.split()[-1]) == int(last_step.split()[-1]) - 5

        # A threshold typed as a real number is read as typed: "2.5" is refused (a whole-number field
        # read it as 2 without a word), "1e3" is 1,000 (it was 1).
        threshold = page.get_by_label("Observation threshold (tokens)")
        threshold.fill("2.5")
        threshold.press("Enter")
        settle(page)
        page.get_by_text("observation threshold must be a whole number of at least 1, not 2.5").wait_for(
            timeout=30_000)
        assert page.get_by_role("button", name="Run replay").is_disabled()
        threshold.fill("1e3")
        threshold.press("Enter")
        settle(page)
        assert threshold.input_value() == "1000" and page.get_by_text("must be a whole number").count() == 0

        # Run a second configuration from the sidebar, then compare the two.
        page.get_by_label("Observation threshold (tokens)").fill("150")
        page.get_by_label("Observation threshold (tokens)").press("Enter")
        settle(page)
        page.get_by_role("button", name="Run replay").click()
        settle(page)
        page.get_by_role("link", name="Compare").click()
        settle(page)
        page.get_by_text("Pick two stored runs").click()  # experiments are the default mode
        settle(page)
        page.get_by_text("Probes one keeps and the other loses").wait_for(timeout=90_000)
        assert wait_for_charts(page, 4) == 4
        page.screenshot(path=str(shots / "compare.png"), full_page=False)

        # A laptop's 900 px with the sidebar open: narrow margins, not 440 px of table between 80 px ones.
        page.set_viewport_size({"width": 900, "height": 900})
        page.wait_for_timeout(500)
        width, padding = page.evaluate("() => { const m = document.querySelector("
                                       "'[data-testid=\"stMainBlockContainer\"]'); "
                                       "return [m.clientWidth, parseFloat(getComputedStyle(m).paddingLeft)]; }")
        assert padding <= 24 and width - 2 * padding >= 540, (width, padding)


PAYLOADS = [
    "<script>window.__omem_pwned = 1</script> Anna booked Lisbon for 3 June.",
    '<img src=x onerror="window.__omem_pwned = 2"> Bruno paid 40 euros.',
    "**not bold** [a link](javascript:window.__omem_pwned=3) Carla moved to Porto on 9 May, see "
    "www.evil.example or write to carla@evil.example.",
]


def test_dataset_and_model_text_is_inert(server) -> None:
    import json

    url, tmp = server
    dataset = tmp / "hostile.jsonl"
    lines = []
    for i in range(12):
        lines.append({"conversation_id": "hostile<b>x</b> http://evil.example", "id": f"h{i}", "role": "user" if i % 2 == 0 else "assistant",
                      "content": PAYLOADS[i % 3], "timestamp": f"2024-05-0{1 + i // 4}T10:0{i % 4}:00Z"})
    dataset.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with chromium(tmp / "profile2", 1400, 1000) as page:
        page.goto(url)
        settle(page)
        page.get_by_role("heading", name=re.compile(r"^At step \d+")).first.wait_for(timeout=90_000)
        page.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"]').first.click()
        page.get_by_role("option", name="Upload a file…").click()
        settle(page)
        page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(dataset))
        settle(page)
        notice = page.get_by_text(re.compile(r"No run of hostile<b>x</b> http://evil\.example yet"))
        notice.wait_for(timeout=30_000)
        # Escaped Markdown still made a live link of a URL or an e-mail address (GFM finds them after
        # escapes); shown as code, the address is copied as written (no invisible word joiner in it)
        assert page.locator('a[href*="evil.example"]').count() == 0
        assert "http://evil.example" in notice.inner_text() and "\u2060" not in notice.inner_text()
        page.get_by_label("Observation threshold (tokens)").fill("20")
        page.get_by_label("Observation threshold (tokens)").press("Enter")
        settle(page)
        page.get_by_role("button", name="Run replay").click()
        settle(page)
        page.get_by_text("hostile<b>x</b>").first.wait_for(timeout=60_000)  # shown literally
        page.get_by_role("tab", name="What the agent sees").click()
        page.wait_for_timeout(500)
        text = page.locator('[data-testid="stMain"]').inner_text()
        assert "<script>window.__omem_pwned = 1</script>" in text
        assert '<img src=x onerror="window.__omem_pwned = 2">' in text
        assert "**not bold**" in text  # not rendered as Markdown either
        assert page.evaluate("window.__omem_pwned === undefined")
        assert page.locator('[data-testid="stMain"] img[src="x"]').count() == 0
        assert page.locator('[data-testid="stMain"] a[href^="javascript"]').count() == 0
        assert page.locator('a[href*="evil.example"]').count() == 0
        # An upload that cannot be read: its error names the file chosen (not the server's copy), and
        # nothing of the run above stays under it as if the upload had produced it.
        broken = tmp / "broken.jsonl"
        broken.write_text('{"conversation_id": "c", "id": "m1", "role": "robot", "content": "x", "timestamp": "2024-01-01"}\n')
        page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(broken))
        settle(page)
        banner = page.get_by_text(re.compile(r"Cannot read the dataset: broken\.jsonl: line 1: field 'role'"))
        banner.wait_for(timeout=30_000)
        assert "omem-uploads" not in banner.inner_text()
        assert page.get_by_role("tab", name="What the agent sees").count() == 0


def test_experiment_grid_and_exported_html_from_disk(server) -> None:
    """Launch a small experiment in the app, read the probe grid, then open the exported HTML file
    from disk (file://, no server) and check it draws its charts with no network request."""
    url, tmp = server
    shots = Path(os.environ.get("OMEM_SCREENSHOT_DIR") or tmp)
    shots.mkdir(parents=True, exist_ok=True)
    with chromium(tmp / "profile3") as page:
        page.goto(f"{url}/experiments")
        settle(page)
        thresholds = page.get_by_role("textbox", name="Observation thresholds")
        thresholds.fill("150,300,600")
        thresholds.press("Enter")
        settle(page)
        page.get_by_text("3 runs: 1 conversation × 3 configurations").wait_for(timeout=30_000)
        page.get_by_role("button", name="Start experiment").click()
        page.get_by_text(re.compile(r"completed: 3 runs replayed in")).wait_for(timeout=120_000)
        settle(page)
        page.screenshot(path=str(shots / "experiments.png"), full_page=False)

        page.get_by_role("link", name="Tune").click()
        settle(page)
        assert wait_for_charts(page, 3) >= 3  # the Pareto chart and two heatmaps
        page.screenshot(path=str(shots / "tune.png"), full_page=False)

        page.get_by_role("link", name="Compare").click()
        settle(page)
        page.get_by_text("Probes × configurations").wait_for(timeout=60_000)
        page.get_by_role("heading", name="Probes × configurations").scroll_into_view_if_needed()
        caption = page.get_by_text(re.compile(r"^\d+ of \d+ probes")).first
        caption.wait_for(timeout=30_000)
        total = int(caption.inner_text().split(" of ")[1].split()[0])
        assert total == 22  # every probe of the demo conversation, one row each
        page.get_by_text("Only probes whose scores differ").click()
        settle(page)
        page.get_by_text(re.compile(rf"^\d+ of {total} probes")).first.wait_for(timeout=30_000)
        shown = int(page.get_by_text(re.compile(r"^\d+ of \d+ probes")).first.inner_text().split()[0])
        assert 0 < shown < total
        page.get_by_role("heading", name="Probes × configurations").scroll_into_view_if_needed()
        page.wait_for_timeout(500)
        page.screenshot(path=str(shots / "compare-grid.png"), full_page=False)
        main_text = page.locator('[data-testid="stMain"]').inner_text()
        assert not re.search(r"\bnan\b|\$nan|nanx", main_text, re.IGNORECASE)
        # The Probe box shows a probe the toggle left listed, and Open run opens that one: the box
        # kept showing the first probe of the whole list while Open run opened another.
        shown_value = page.get_by_role("combobox", name="Probe").input_value().strip()  # what the box shows
        assert shown_value.startswith("priya-lisbon · p"), shown_value
        probe = " · ".join(shown_value.split(" · ")[:2])  # "priya-lisbon · p02"
        page.get_by_role("button", name="Open run").click()
        settle(page)
        page.get_by_text(f"Opened from Compare for probe {probe}:").wait_for(timeout=60_000)

        page.get_by_role("link", name="Experiments").click()
        settle(page)
        page.get_by_role("button", name="Prepare HTML export").click()
        settle(page)
        with page.expect_download() as download:
            page.get_by_role("button", name="Download HTML").click()
        exported = tmp / "experiment.html"
        download.value.save_as(exported)

    with chromium(tmp / "profile4") as page:
        requests = []
        page.on("request", lambda request: requests.append(request.url))
        page.goto(exported.as_uri())
        page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length >= 3", timeout=30_000)
        text = page.locator("body").inner_text()
        assert "Pooled retention (95% CI) vs compression" in text and "obs 150" in text
        assert "Loss funnel" in text and "Compared with obs 150" in text
        assert not re.search(r"\bnan\b|\$nan|nanx", text, re.IGNORECASE)
        page.wait_for_timeout(500)
        assert requests and all(u.startswith(("file://", "data:", "blob:")) for u in requests), requests
        page.set_viewport_size({"width": 900, "height": 800})  # a wide table scrolls, not the page
        page.wait_for_timeout(500)
        assert page.evaluate("document.documentElement.scrollWidth") <= 900


def fill_new_experiment(page, thresholds: str) -> None:
    """Open the "New experiment" form and set its observation thresholds. The form collapses on the
    rerun after an experiment ends (it opens by itself only while there is none), and on a loaded
    machine that rerun can come after the form was found open: so each step is checked, and retried."""
    box = page.get_by_role("textbox", name="Observation thresholds")
    for _ in range(5):
        settle(page)
        if not box.is_visible():
            page.get_by_text("New experiment").click()
            settle(page)
        try:
            box.fill(thresholds, timeout=10_000)
            box.press("Enter")
            settle(page)
            if box.is_visible() and box.input_value() == thresholds:
                return
        except playwright.TimeoutError:
            continue
    raise AssertionError(f"could not set the observation thresholds to {thresholds}")


def test_a_new_experiment_is_the_one_the_picker_shows(server) -> None:
    """Start one experiment, then another: the "Experiment" picker shows the new one, as the details
    below it do (Tune, Compare and Delete act on the picker). The browser keeps a widget's own
    selection unless the app sets it, which AppTest does not model: it failed here only."""
    url, tmp = server
    with chromium(tmp / "profile5") as page:
        page.goto(f"{url}/experiments")
        settle(page)
        for thresholds in ("300", "150"):
            fill_new_experiment(page, thresholds)
            page.get_by_role("button", name="Start experiment").click()
            page.get_by_text(re.compile(r"completed: 1 run replayed in")).wait_for(timeout=120_000)
            settle(page)
        picker = page.get_by_role("combobox", name="Experiment", exact=True).input_value()
        details = page.get_by_text(re.compile(r"^exp-\S+ · completed · ")).first.inner_text()
        newest = page.get_by_text(re.compile(r"^exp-\S+ completed: 1 run replayed in")).first.inner_text()
        newest = newest.split()[0]
        assert details.split(" · ")[0] == newest
        assert picker.split(" · ")[-1] == newest, (picker, details)  # (the id comes last in the picker)

        # Another kind of dataset: the thresholds shown switch to the defaults around 1000 / 2000.
        if not page.get_by_role("button", name="Start experiment").is_visible():
            page.get_by_text("New experiment").click()
            settle(page)
        page.get_by_role("combobox", name="Dataset").click()
        page.get_by_role("option", name=re.compile(r"^tiny ")).click()
        settle(page)
        assert page.get_by_role("textbox", name="Observation thresholds").input_value() == "500,1000,2000"
        assert page.get_by_role("textbox", name="Reflection thresholds").input_value() == "2000"



RUNS = 40  # runs of the experiment the app resumes


def test_an_experiment_the_app_resumes_goes_on_when_the_page_is_left(server) -> None:
    """Found in Chromium (twice): an experiment run in the page's script stopped when its user
    opened another page or closed the tab. It runs in the app's process now, its buttons disabled
    (Resume, Delete) while it runs, and is followed again on return."""
    from workbench.experiments import ExperimentOptions, create_experiment
    from workbench.replay import ReplayConfig
    from workbench.runstore import RunStore

    url, tmp = server
    # The demo told four times over (a year apart): runs long enough to be seen running, in a grid
    # small enough that the page is drawn again every few seconds (it waits 4 draws' time between)
    records = [json.loads(line) for line in (ROOT / "datasets" / "demo.jsonl").read_text().splitlines()]
    long = tmp / "long.jsonl"
    with long.open("w") as out:
        for k in range(4):
            for r in records:
                if r["type"] == "message":
                    year = int(r["timestamp"][:4]) + k
                    out.write(json.dumps({**r, "id": f"{r['id']}-{k}", "timestamp": f"{year}{r['timestamp'][4:]}"}) + "\n")
        for r in records:
            if r["type"] == "probe":
                out.write(json.dumps({**r, "evidence": [f"{e}-0" for e in r.get("evidence", [])]}) + "\n")
    grid = [ReplayConfig(observation_threshold=o, reflection_threshold=1200, last_messages=4)
            for o in range(100, 100 * (RUNS + 1), 100)]
    with RunStore(tmp / "e2e.duckdb") as store:  # recorded, then interrupted before its first run
        experiment_id = create_experiment(store, dataset=long, grid=grid, options=ExperimentOptions(concurrency=1))
        store.finish_experiment(experiment_id, "interrupted", "stopped for the test", 0.0)
    with chromium(tmp / "profile6") as page:
        page.goto(f"{url}/experiments")
        settle(page)
        page.get_by_text("Confirm delete").click()  # Delete armed before the resume
        settle(page)
        page.get_by_role("button", name=re.compile(rf"^Resume \({RUNS} left")).click()
        page.get_by_text(re.compile(rf"\d+ of {RUNS} runs to replay done")).wait_for(timeout=60_000)  # running now
        resume = page.get_by_role("button", name=re.compile(r"^Resume$"))  # (bare while it runs)
        # (the progress is drawn above the buttons: the run before's are on screen a moment more)
        # (a disabled button with a tooltip is drawn twice by Streamlit, once inside the tooltip: the one
        # on screen is the one with a size)
        page.wait_for_function("() => { const r = [...document.querySelectorAll('button')].filter(b => "
                               "b.innerText.trim() == 'Resume' && b.getBoundingClientRect().width > 0); "
                               "return r.length == 1 && r[0].disabled; }", timeout=30_000)
        assert resume.first.is_disabled()
        # (Delete alike: under load, the enabled button of the run before was still on screen beside
        # the new, disabled one, and a strict locator found two)
        page.wait_for_function("() => { const r = [...document.querySelectorAll('button')].filter(b => "
                               "b.innerText.trim() == 'Delete experiment' && b.getBoundingClientRect().width > 0); "
                               "return r.length == 1 && r[0].disabled; }", timeout=30_000)
        assert page.get_by_role("checkbox", name="Confirm delete").is_disabled()
        assert page.get_by_text(re.compile(rf"^{experiment_id} · running · ")).count() == 1
        assert page.get_by_text("This experiment was interrupted").count() == 0
        page.get_by_role("link", name="Runs").click()  # leave the page: Streamlit stops its script
        settle(page)
        page.wait_for_timeout(1500)
        page.get_by_role("link", name="Experiments").click()
        settle(page)
        assert page.get_by_text("This experiment was interrupted").count() == 0
        # While it runs, the page follows the runs written: its counts of runs completed (the
        # picker's, Resume's "N left") stayed as the page was drawn ("2 of 32 runs completed" beside
        # "4 of 32 runs to replay done").
        def counts() -> tuple[int, int] | None:
            text = page.inner_text("body")
            done = re.search(rf"(\d+) of {RUNS} runs to replay done", text)
            completed = re.search(rf" · running · (\d+) of {RUNS} runs completed", text)
            return (int(done.group(1)), RUNS - int(completed.group(1))) if done and completed else None

        def running_counts(until: float) -> tuple[int, int] | None:  # (None for a moment: a redraw)
            while (seen := counts()) is None and time.monotonic() < until and not page.get_by_text(
                    re.compile(rf"completed: {RUNS} runs replayed in")).count():
                page.wait_for_timeout(100)
            return seen

        start = running_counts(time.monotonic() + 10)
        assert start is not None, "not seen running: the check needs a longer experiment"
        while (now := running_counts(time.monotonic() + 10)) is not None and now[0] < start[0] + 3:
            page.wait_for_timeout(200)
        assert now is not None, "it ended before three more runs were written: the check needs a longer experiment"
        deadline = time.monotonic() + 20  # (drawn again every 3 s or more: 4 times as long as a draw takes)
        while (later := running_counts(deadline)) is not None and later[1] > RUNS - now[0] \
                and time.monotonic() < deadline:
            page.wait_for_timeout(200)
        assert later is None or later[1] <= RUNS - now[0], (start, now, later)
        page.get_by_text(re.compile(rf"completed: {RUNS} runs replayed in")).wait_for(timeout=300_000)
        settle(page)
        assert not page.get_by_role("checkbox", name="Confirm delete").is_checked()  # (Delete was live at once)
    with RunStore(tmp / "e2e.duckdb") as store:
        assert store.experiment(experiment_id)["status"] == "completed"
        assert len(store.experiment_runs(experiment_id)) == RUNS
