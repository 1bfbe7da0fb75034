"""Keep a random sample of a cosmic-ray session's mutants, so `cosmic-ray exec` runs only those.

    cosmic-ray init scripts/cosmic-ray/algos.toml algos.sqlite
    python scripts/cosmic_ray_sample.py algos.sqlite 40 [--seed 0]
    cosmic-ray exec scripts/cosmic-ray/algos.toml algos.sqlite && cr-report algos.sqlite

cosmic-ray 8.7 has no sampling of its own, and a whole session here is thousands of mutants, each a fresh
interpreter running its test command (docs/testing.md): the score of a sample is an estimate, said as one.
"""
from __future__ import annotations

import argparse
import random
import sqlite3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("session")
    ap.add_argument("n", type=int)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    db = sqlite3.connect(args.session)
    jobs = [j for (j,) in db.execute("SELECT job_id FROM work_items WHERE job_id NOT IN "
                                     "(SELECT job_id FROM work_results) ORDER BY job_id")]
    keep = set(random.Random(args.seed).sample(jobs, min(args.n, len(jobs))))
    drop = [(j,) for j in jobs if j not in keep]
    db.executemany("DELETE FROM mutation_specs WHERE job_id = ?", drop)
    db.executemany("DELETE FROM work_items WHERE job_id = ?", drop)
    db.commit()
    print(f"{len(keep)} of {len(jobs)} mutants kept (seed {args.seed})")


if __name__ == "__main__":
    main()
