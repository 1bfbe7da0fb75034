"""results/FINDINGS_changes.md: every verdict that moved between FINDINGS v2 and v3 (and in the arithmetic LM
rerun that followed), and which rule moved it. A record, frozen at commit FROZEN_AT:

    python scripts/findings_changes.py [RESULTS]

v3 gave way to v4's rules (*not exercised*, crossed seeds x problems tests), which FINDINGS_rules.md replays
(`python -m grpo_bench.analysis.rule_changes`). Replaying v2 -> v3 with today's judge cannot reproduce v3: the
replay's last step must equal v3's own verdicts, and today's judge gives v4's. So this runs the script, the
package and the results as they were at FROZEN_AT, from `git archive`, and writes that run's file into RESULTS.
Its output is the committed file byte for byte (checked 2026-11-29). The replay itself (v2's cells recomputed
from the results with v2's rule, checked against the v2 file, then v3's five changes applied one at a time) is
that commit's scripts/findings_changes.py.
"""
from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

FROZEN_AT = "3954404"   # the last commit that wrote results/FINDINGS_changes.md, before v4's rules
ROOT = Path(__file__).resolve().parent.parent


def main(out: Path) -> Path:
    try:
        archive = subprocess.run(["git", "archive", FROZEN_AT, "grpo_bench", "results", "ablations", "scripts"],
                                 cwd=ROOT, capture_output=True, check=True).stdout
    except subprocess.CalledProcessError as e:
        sys.exit(f"findings_changes.py: commit {FROZEN_AT} is not in this clone ({e.stderr.decode().strip()}); "
                 "fetch the full history (git fetch --unshallow)")
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        # cwd stays this clone: the frozen script reads v2's and v3's FINDINGS with `git show`
        subprocess.run([sys.executable, str(Path(tmp) / "scripts" / "findings_changes.py"), str(Path(tmp) / "results")],
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": tmp}, check=True, stdout=subprocess.DEVNULL)
        shutil.copyfile(Path(tmp) / "results" / "FINDINGS_changes.md", out / "FINDINGS_changes.md")
    return out / "FINDINGS_changes.md"


if __name__ == "__main__":
    print(main(Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "results")))
