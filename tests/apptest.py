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
    if page is not None:
        at.switch_page(PAGES.format(page)).run()
    assert not at.exception, at.exception
    return at
