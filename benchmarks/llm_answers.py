"""The answers a `zerosiam llm` store holds, per method, as JSON: to compare two versions of the code.

Run the same `zerosiam llm` command before and after a change, then dump both stores and compare:

    zerosiam llm --model smollm2-135m --dataset math500 --limit 5 --max-new-tokens 128 \\
        --methods noadapt,tent,zerosiam,sar,eata,come,tlm --db runs/llm_answers.db
    python benchmarks/llm_answers.py runs/llm_answers.db --out answers.json
    python benchmarks/llm_answers.py runs/llm_answers.db --compare benchmarks/goldens/smollm2_math500_5.json

The store is read with sqlite3 alone, so this script does not depend on the package's internals.
"""

from __future__ import annotations

import argparse
import json
import math
import sqlite3
import sys
from pathlib import Path
from typing import Any


def answers(db: Path) -> dict[str, dict[str, Any]]:
    """Per ``method/dataset``: the generated texts, extracted answers and per-question losses."""
    with sqlite3.connect(db) as connection:
        rows = connection.execute("SELECT spec, curves FROM runs WHERE kind = 'llm'").fetchall()
    found = {}
    for spec_text, curves_text in rows:
        spec, curves = json.loads(spec_text), json.loads(curves_text)
        found[f"{spec['method']}/{spec['dataset']}"] = {
            "ids": curves["id"],
            "texts": curves["text"],
            "predictions": curves["prediction"],
            "losses": curves["loss"],
        }
    return dict(sorted(found.items()))


def differences(now: dict[str, Any], golden: dict[str, Any], tolerance: float = 1e-4) -> list[str]:
    """What differs: missing runs, any generated text, or a loss beyond ``tolerance``."""
    problems = [f"{key}: missing" for key in golden if key not in now]
    for key in golden.keys() & now.keys():
        mine, theirs = now[key], golden[key]
        for i, (a, b) in enumerate(zip(mine["texts"], theirs["texts"], strict=True)):
            if a != b:
                problems.append(f"{key} question {i}: the generated text differs")
        for i, (a, b) in enumerate(zip(mine["losses"], theirs["losses"], strict=True)):
            both_missing = (a is None or math.isnan(a)) and (b is None or math.isnan(b))
            if not both_missing and (a is None or b is None or abs(a - b) > tolerance):
                problems.append(f"{key} question {i}: loss {a} vs {b}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("db", type=Path)
    parser.add_argument("--out", type=Path, help="write the answers as JSON")
    parser.add_argument("--compare", type=Path, help="a JSON written before, to compare with")
    args = parser.parse_args()
    now = answers(args.db)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(now, indent=1) + "\n")
    if args.compare:
        problems = differences(now, json.loads(args.compare.read_text()))
        print("\n".join(problems) if problems else f"identical: {len(now)} runs")
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
