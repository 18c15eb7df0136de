"""How long the CLI's quick commands take, whole process, several runs each.

    python bench/bench_cli.py [--runs 5]

Each command is started as a new process (what a user waits for), and the time until it exits is
measured; the table gives the median and the worst of the runs, next to ``python -c pass`` (the
interpreter's own start) and ``import litellm`` (what the quick paths must not pay). Target:
``--help`` within 1.5 s on the project's 2-core machine.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(command: list[str], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        times.append(time.perf_counter() - started)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    python = sys.executable
    with tempfile.TemporaryDirectory() as folder:
        db = str(Path(folder) / "runs.duckdb")
        subprocess.run([python, "-m", "workbench", "replay", "--db", db, "--no-cache"], cwd=ROOT,
                       capture_output=True, check=True)  # one run to list
        cases = [
            ("python -c pass", [python, "-c", "pass"]),
            ("python -m workbench --help", [python, "-m", "workbench", "--help"]),
            ("python -m workbench runs", [python, "-m", "workbench", "runs", "--db", db]),
            ("python -m workbench datasets", [python, "-m", "workbench", "datasets"]),
            ("python -c 'import omem_core' (litellm)", [python, "-c", "import omem_core"]),
        ]
        print(f"{'command':<40} {'median s':>9} {'worst s':>8}   ({args.runs} runs each)")
        medians = {}
        for name, command in cases:
            times = timed(command, args.runs)
            medians[name] = statistics.median(times)
            print(f"{name:<40} {medians[name]:>9.2f} {max(times):>8.2f}")
    help_s = medians["python -m workbench --help"]
    print(f"\n--help: {help_s:.2f} s (target <= 1.5 s: {'met' if help_s <= 1.5 else 'NOT met'}); "
          f"importing litellm alone takes {medians[cases[-1][0]] / max(help_s, 1e-9):.0f}x as long")


if __name__ == "__main__":
    main()
