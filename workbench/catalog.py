"""Where datasets are: the project's own (``datasets/``: its JSON Lines files and, under
``datasets/samples/``, small samples of the public formats) and the shared real ones when present."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .datasets import DatasetError, detect_format

ROOT = Path(__file__).resolve().parents[1]
PROJECT_DATASETS = ROOT / "datasets"
SAMPLES = PROJECT_DATASETS / "samples"
DEMO_DATASET = PROJECT_DATASETS / "demo.jsonl"


def shared_datasets_dir() -> Path:
    """``$OMEM_SHARED_DATASETS`` or ``../shared/datasets`` beside the repository."""
    return Path(os.environ.get("OMEM_SHARED_DATASETS") or ROOT.parent / "shared" / "datasets")


@dataclass(frozen=True)
class DatasetEntry:
    name: str
    path: Path
    format: str | None  # None: detected when loaded
    origin: str  # "project" | "shared"


def _detected(path: Path) -> str | None:
    try:
        return detect_format(path)
    except DatasetError:
        return None  # loading it will say what is wrong


def known_datasets() -> list[DatasetEntry]:
    entries = [DatasetEntry(p.stem, p, "omem", "project") for p in sorted(PROJECT_DATASETS.glob("*.jsonl"))]
    samples = sorted(p for p in SAMPLES.glob("*") if p.is_dir() or p.suffix in (".json", ".jsonl"))
    entries += [DatasetEntry(p.stem, p, _detected(p), "project") for p in samples]
    shared = shared_datasets_dir()
    candidates = [
        ("locomo-dev", shared / "locomo-dev" / "locomo-dev.json", "locomo"),
        ("beam-100k", shared / "beam-100k-dev", "beam"),  # every chat: a dataset-wide experiment
        *[(f"beam-100k-{p.name}", p, "beam") for p in sorted((shared / "beam-100k-dev").glob("*")) if p.is_dir()],
        ("memorybank", shared / "memorybank", "memorybank"),
    ]
    entries += [DatasetEntry(name, path, fmt, "shared") for name, path, fmt in candidates if path.exists()]
    entries += _other_shared(shared, {path for _, path, _ in candidates}, {e.name for e in entries})
    return entries


def _other_shared(shared: Path, known: set[Path], names: set[str]) -> list[DatasetEntry]:
    """Whatever else in the shared folder is a dataset (a LongMemEval file put there, say), by its
    name: listed, and usable by name, without a change here."""
    try:
        children = sorted(shared.iterdir())
    except OSError:
        return []
    found = []

    def add(name: str, path: Path, fmt: str) -> None:
        if name in names:  # (a project dataset, or a known one, has it: this one is told apart)
            name = f"shared/{name}"
        if name not in names:
            names.add(name)
            found.append(DatasetEntry(name, path, fmt, "shared"))

    for child in children:
        if child.name.startswith(".") or child in known or any(child in path.parents for path in known):
            continue
        if not (child.is_dir() or child.suffix.lower() in (".json", ".jsonl")):
            continue
        fmt = _detected(child)
        if fmt is not None:
            add(child.stem, child, fmt)
            continue
        inner = sorted(p for p in child.glob("*.json*") if p.suffix.lower() in (".json", ".jsonl")) \
            if child.is_dir() else []
        subfolders = sorted(p for p in child.iterdir() if p.is_dir() and not p.name.startswith(".")) \
            if child.is_dir() else []
        detected = {p: _detected(p) for p in [*inner, *subfolders]}
        datasets = [(p, f) for p, f in detected.items() if f is not None]
        # a folder of several dataset files (LongMemEval's s, m and oracle), or of dataset folders
        # beside a file (BEAM chats beside a dataset file: not one dataset, but each is one); a JSON
        # file beside them that no format reads (cut off by a download) is listed too, unreadable
        for path, inner_fmt in detected.items():
            if inner_fmt is not None or (datasets and path.is_file()):
                add(f"{child.name}/{path.stem if path.is_file() else path.name}", path, inner_fmt)
        if not datasets and (child.is_file() or inner or any(child.glob("*/*.json*"))):
            # JSON that is no dataset the workbench can read (cut off, a folder it cannot tell how
            # to read): listed with no format, so the listing says why rather than leave it out
            add(child.stem, child, None)
    return found
