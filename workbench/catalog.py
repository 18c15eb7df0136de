"""Where datasets are: the project's own (``datasets/``) and the shared real ones when present."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT_DATASETS = ROOT / "datasets"
DEMO_DATASET = PROJECT_DATASETS / "demo.jsonl"


def shared_datasets_dir() -> Path:
    """``$OMEM_SHARED_DATASETS`` or ``../shared/datasets`` beside the repository."""
    return Path(os.environ.get("OMEM_SHARED_DATASETS") or ROOT.parent / "shared" / "datasets")


@dataclass(frozen=True)
class DatasetEntry:
    name: str
    path: Path
    format: str | None
    origin: str  # "project" | "shared"


def known_datasets() -> list[DatasetEntry]:
    entries = [DatasetEntry(p.stem, p, "omem", "project") for p in sorted(PROJECT_DATASETS.glob("*.jsonl"))]
    shared = shared_datasets_dir()
    candidates = [
        ("locomo-dev", shared / "locomo-dev" / "locomo-dev.json", "locomo"),
        *[(f"beam-100k-{p.name}", p, "beam") for p in sorted((shared / "beam-100k-dev").glob("*")) if p.is_dir()],
        ("memorybank", shared / "memorybank", "memorybank"),
    ]
    entries += [DatasetEntry(name, path, fmt, "shared") for name, path, fmt in candidates if path.exists()]
    return entries
