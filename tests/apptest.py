"""What the AppTest-based test files share: the app's entry, its pages, and opening one."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[1] / "app.py")
PAGES = "workbench/app_pages/{}.py"


def app(page: str | None = None) -> AppTest:
    """The app run headless (its first page, the explorer, replays the demo on a fresh store),
    then ``page`` when given; no exception either time."""
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    if page is not None:  # (a browser's page change clears the address's parameters; AppTest's keeps them)
        at.query_params.clear()
        at.switch_page(PAGES.format(page)).run()
    assert not at.exception, at.exception
    return at


def finish_experiments(at: AppTest, timeout: float = 300) -> AppTest:
    """Wait for the experiments the app runs in the background (Start, Resume), then rerun the
    page as its watch does once they end (not when none was running any more: the page has said
    their outcome, once); no exception."""
    from workbench import background

    running = background.running()
    for experiment_id in running:
        background.wait(experiment_id, timeout)
    # (an experiment that ended after the page last looked: its outcome is said at the next run)
    unsaid = "xp_watched" in at.session_state and bool(at.session_state["xp_watched"])
    if running or unsaid:
        at.run()
    assert not at.exception, at.exception
    return at


def action(at: AppTest, name: str):  # type: ignore[no-untyped-def]
    """The page's action button ``name``. Its key names what it acts on (``xp_resume_<experiment>``,
    ``runs_delete_<run>``): a click on a page whose run or experiment was deleted elsewhere meets a
    button of another key in the rerun that falls back to another one, so it acts on nothing."""
    [button] = [b for b in at.button if b.key.startswith(f"{name}_")]
    return button
