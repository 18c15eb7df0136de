"""omem_core ships ``py.typed``, so applications type-check against its annotations: they must
hold. (A wrong one — ``int | None`` where an ``int`` is promised — misleads every caller's checker.)"""

from __future__ import annotations

import subprocess
import sys
from importlib.resources import files
from pathlib import Path


def test_the_library_declares_and_passes_its_types(tmp_path) -> None:
    assert files("omem_core").joinpath("py.typed").is_file()
    package = Path(__file__).resolve().parents[1] / "omem_core"
    checked = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path), str(package)],
                             capture_output=True, text=True, timeout=600)
    assert checked.returncode == 0, checked.stdout + checked.stderr
