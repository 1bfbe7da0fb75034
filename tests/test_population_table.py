"""results/population/population.md is what bench_population draws from the committed population.csv, and the
table's arithmetic by hand."""
import json
import os
import subprocess
import sys

import pandas as pd
from helpers import ROOT

from grpo_bench.analysis import bench_population as bp

POP = ROOT / "results" / "population"


def test_the_committed_table_is_drawn_from_the_committed_csv():
    assert bp.table(bp.read(POP / "population.csv")) == (POP / "population.md").read_text()


def test_speed_up_and_memory_per_member_by_hand():
    rows = [dict(ablation="toy", seeds=4, population=4, runs=16, cpu_s=8.0, wall_s=5.0, cpu_s_per_run=0.5,
                 runs_per_core_minute=120.0, peak_rss_mb=400.0, sets="", device="CPU X", load_avg=1.5),
            dict(ablation="toy", seeds=4, population=1, runs=4, cpu_s=8.0, wall_s=9.0, cpu_s_per_run=2.0,
                 runs_per_core_minute=30.0, peak_rss_mb=310.0, sets="", device="CPU X", load_avg=1.25),
            dict(ablation="lm", seeds=2, population=1, runs=2, cpu_s=9.0, wall_s=9.0, cpu_s_per_run=4.5,
                 runs_per_core_minute=13.3, peak_rss_mb=800.0, sets="epochs=2", device="CPU X", load_avg=2.0),
            dict(ablation="lm", seeds=2, population=2, runs=2, cpu_s=9.0, wall_s=9.0, cpu_s_per_run=6.0,
                 runs_per_core_minute=10.0, peak_rss_mb=1000.0, sets="epochs=2", device="CPU X", load_avg=1.75)]
    lines = bp.table(pd.DataFrame(rows)).splitlines()
    assert lines[2:6] == [
        "| toy | 4 | 1 | 4 | 2.00 | 30.0 | 1.0x | 310 | — |",
        "| toy | 4 | 4 | 16 | 0.50 | 120.0 | 4.0x | 400 | 30.0 |",     # (400 - 310) / 3 members more
        "| lm (epochs=2) | 2 | 1 | 2 | 4.50 | 13.3 | 1.0x | 800 | — |",
        "| lm (epochs=2) | 2 | 2 | 2 | 6.00 | 10.0 | 0.8x | 1000 | 200.0 |"]
    assert lines[-1] == ("Measured on CPU X; load average 1.25-2.00 during the runs, one torch thread per process, "
                         "each provider in a fresh process, in one sitting.")


def test_a_csv_round_trip_keeps_an_empty_override_empty(tmp_path):
    df = pd.DataFrame([dict(zip(bp.COLUMNS, ["toy", 1, 1, 1, 1.0, 1.0, 1.0, 60.0, 300.0, "", "CPU X", 1.0]))])
    df.to_csv(tmp_path / "p.csv", index=False)
    back = bp.read(tmp_path / "p.csv")
    assert back.sets.tolist() == [""] and "| toy | 1 | 1 |" in bp.table(back)   # not "toy (nan)"


def benchmark_json(tmp_path):
    info = [dict(zip(bp.COLUMNS, ["toy", 4, p, 4 * p, 8.0, 5.0, 2.0 / p, 30.0 * p, 300.0 + 10 * p, "", "CPU X", 1.5]),
                 timer="perf_counter") for p in (1, 2)]   # a key of the benchmark's own, not a column
    (tmp_path / "b.json").write_text(json.dumps({"benchmarks": [{"extra_info": i} for i in info]}))
    return tmp_path / "b.json"


def test_main_writes_the_csv_and_the_table_from_the_benchmark_json(tmp_path, monkeypatch, capsys):
    """As its docstring runs it, from a checkout's root: pytest-benchmark's JSON -> results/population/."""
    monkeypatch.chdir(tmp_path)
    bp.main(str(benchmark_json(tmp_path)))
    out = tmp_path / "results" / "population"
    csv = pd.read_csv(out / "population.csv", keep_default_na=False)
    assert list(csv.columns) == bp.COLUMNS and csv.population.tolist() == [1, 2]
    md = (out / "population.md").read_text()
    assert md == bp.table(bp.read(out / "population.csv")) and "| toy | 4 | 2 | 8 | 1.00 | 60.0 | 2.0x | 320 | 10.0 |" in md
    assert capsys.readouterr().out == md + "\n"
    bp.main(str(benchmark_json(tmp_path)))    # again, into the directory the first run made: rewritten
    assert (out / "population.md").read_text() == md


def test_the_module_runs_as_its_docstring_says(tmp_path):
    r = subprocess.run([sys.executable, "-m", "grpo_bench.analysis.bench_population", str(benchmark_json(tmp_path))],
                       cwd=tmp_path, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                       timeout=120)
    assert r.returncode == 0 and (tmp_path / "results" / "population" / "population.md").read_text() in r.stdout
