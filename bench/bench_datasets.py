"""Dataset loading at LongMemEval S size: listing and single-instance loads of a large file.

    python bench/bench_datasets.py              # generates a ~300 MB file in a temporary folder
    python bench/bench_datasets.py --mb 100 --keep /tmp/lme.json   # smaller; keep it for reruns

The S file is ~500 instances of ~115k tokens each (hundreds of MB). This generates a file of that
shape (the published schema, invented text) and measures, with a fresh index cache:

* detection (reads the first instance only);
* the first listing (``list_conversations``: one streaming pass that builds the byte-offset
  index and stores it in the cache) — target <= 5 s;
* listing again in this process and in a new process (from the cache on disk);
* loading one instance (the last one) through the index — target <= 2 s ("a replay of one
  instance starts") — and, for comparison, by a scan without an index.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOKENS_PER_INSTANCE = 115_000
SESSIONS = 50

_WORDS = ("the plan trip Lisbon sister arrives March garden coffee budget meeting doctor piano recipe flight "
          "hotel museum weekend project deadline allotment cello marathon bakery invoice podcast train "
          "birthday library apartment lease vegetarian pasta jacket ferry sunset camera notebook").split()


def generate(path: Path, megabytes: int, seed: int = 7) -> tuple[int, list[str]]:
    """Write a LongMemEval-shaped list of instances, about ``megabytes`` MB; return their count and ids."""
    rng = random.Random(seed)
    sentences = [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(8, 30))).capitalize() + "."
                 for _ in range(4000)]
    turn_chars = TOKENS_PER_INSTANCE * 4 // (SESSIONS * 10)
    ids: list[str] = []
    with path.open("w", encoding="utf-8") as out:
        out.write("[")
        i = -1
        while out.tell() < megabytes * 1_000_000:
            i += 1
            sessions, dates, names = [], [], []
            for s in range(SESSIONS):
                turns = []
                for t in range(10):
                    text, size = [], 0
                    while size < turn_chars:
                        sentence = sentences[rng.randrange(len(sentences))]
                        text.append(sentence)
                        size += len(sentence) + 1
                    turn = {"role": "user" if t % 2 == 0 else "assistant", "content": " ".join(text)}
                    if s == 17 and t == 2:
                        turn["has_answer"] = True
                    turns.append(turn)
                sessions.append(turns)
                dates.append(f"2023/{1 + s // 28:02d}/{1 + s % 28:02d} (Mon) {8 + t:02d}:{(7 * s) % 60:02d}")
                names.append(f"sharegpt_{i}_{s}" if s != 17 else f"answer_{i}")
            question_id = f"bench{i:04d}" + ("_abs" if i % 30 == 29 else "")
            ids.append(question_id)
            instance = {"question_id": question_id, "question_type": "multi-session",
                        "question": "Which city did I plan the trip to?", "answer": "Lisbon",
                        "question_date": "2023/03/01 (Wed) 10:00", "haystack_session_ids": names,
                        "haystack_dates": dates, "haystack_sessions": sessions,
                        "answer_session_ids": [f"answer_{i}"]}
            out.write((", " if i else "") + json.dumps(instance))
        out.write("]")
    return len(ids), ids


def timed(function, *args):
    start = time.perf_counter()
    value = function(*args)
    return time.perf_counter() - start, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=300, help="size of the generated file (MB)")
    parser.add_argument("--keep", type=Path, help="write (or reuse) the generated file here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as folder:
        os.environ["OMEM_CACHE_DIR"] = str(Path(folder) / "cache")  # a cold index cache
        path = args.keep or Path(folder) / "longmemeval_s_like.json"
        if not path.exists():
            seconds, (count, ids) = timed(generate, path, args.mb)
            print(f"generated {path} in {seconds:.1f} s")
        from workbench.datasets import detect_format, list_conversations, load_conversation
        from workbench.datasets import index

        size = path.stat().st_size
        detect_s, fmt = timed(detect_format, path)
        first_s, infos = timed(list_conversations, path)
        again_s, _ = timed(list_conversations, path)
        index.clear_memory()
        disk_s, _ = timed(list_conversations, path)
        code = ("import sys, time; from workbench.datasets import list_conversations; t = time.perf_counter(); "
                "n = len(list_conversations(sys.argv[1])); print(n, time.perf_counter() - t)")
        done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
        process_s = float(done.stdout.split()[1])
        last = infos[-1].id
        indexed_s, conversation = timed(load_conversation, path, last)
        index.clear_memory()
        os.environ["OMEM_CACHE_DIR"] = str(Path(folder) / "empty-cache")
        scan_s, _ = timed(load_conversation, path, last)

        tokens = sum(i.tokens for i in infos) / len(infos)
        print(f"\nfile: {size / 1e6:.0f} MB, format {fmt}, {len(infos)} instances, ~{tokens / 1000:.0f}k tokens "
              f"and {infos[-1].messages} messages each\n")
        rows = [
            ("detect the format", detect_s, None),
            ("list conversations, first time (builds the index)", first_s, 5.0),
            ("list again, same process", again_s, None),
            ("list again, index from the disk cache", disk_s, None),
            ("list in a new process, index from the disk cache", process_s, None),
            (f"load one instance ({last}) through the index", indexed_s, 2.0),
            (f"load one instance ({last}) by a scan, no index", scan_s, None),
        ]
        for label, seconds, target in rows:
            verdict = "" if target is None else f"  target <= {target:.0f} s: {'ok' if seconds <= target else 'MISSED'}"
            print(f"  {label:<56} {seconds:8.3f} s{verdict}")
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"\n  peak memory of this process: {peak:.0f} MB (the file is {size / 1e6:.0f} MB; it is never held whole)")
        assert conversation.id == last and conversation.turns


if __name__ == "__main__":
    main()
