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


def test_an_applications_misspelt_memory_call_is_caught_by_its_checker(tmp_path) -> None:
    """``Memory`` looks its working-memory methods up at run time (they exist when its storage has
    them): a ``__getattr__`` a checker saw made every misspelt attribute an ``Any``, so
    ``memory.recal(...)`` passed. The real methods still check."""
    app = tmp_path / "app.py"
    app.write_text("from omem_core import Memory\n\n\n"
                   "async def main(memory: Memory) -> None:\n"
                   "    await memory.recall('t')\n"
                   "    note: str | None = await memory.get_working_memory('t')\n"
                   "    await memory.recal('t')\n")
    root = Path(__file__).resolve().parents[1]
    checked = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"), str(app)],
                             capture_output=True, text=True, timeout=600, cwd=root)
    assert checked.returncode == 1 and '"Memory" has no attribute "recal"' in checked.stdout, checked.stdout
    assert "app.py:7:" in checked.stdout and checked.stdout.count("error:") == 1, checked.stdout
