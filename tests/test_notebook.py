"""The notebook runs top to bottom against a run store made by the engine."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from workbench.catalog import PROJECT_DATASETS
from workbench.datasets import load_conversation
from workbench.replay import ReplayConfig, replay
from workbench.runstore import RunStore

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "explore_runs.ipynb"


def test_explore_runs_notebook_executes(tmp_path, monkeypatch) -> None:
    db = tmp_path / "nb.duckdb"
    with RunStore(db) as store:
        from workbench import experiments as ex

        grid = [ReplayConfig(observation_threshold=t, reflection_threshold=60, last_messages=4, cache=False)
                for t in (40, 80)]
        experiment_id = ex.create_experiment(store, dataset=PROJECT_DATASETS / "tiny.jsonl", grid=grid,
                                             options=ex.ExperimentOptions(concurrency=1, cache=False))
        asyncio.run(ex.run_experiment(store, experiment_id))
        pooled = {s.label: s for s in ex.summarise(store, experiment_id)}
        result = asyncio.run(replay(load_conversation(PROJECT_DATASETS / "tiny.jsonl"),  # the newest run
                                    ReplayConfig(observation_threshold=40, reflection_threshold=60, last_messages=4,
                                                 cache=False), store))
    monkeypatch.setenv("OMEM_DB", str(db))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parents[1])}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    figures = [o for o in outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert len(figures) == 2
    printed = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert f"{result.run_id}: 6 reads" in printed
    assert len(pooled) == 2 and all(s.probes > 0 for s in pooled.values())
    for label, summary in pooled.items():  # the notebook's SQL gives the engine's pooled figures
        assert f"{experiment_id} · {label}: retention {summary.retention:.3f} over {summary.probes} probes" in printed
