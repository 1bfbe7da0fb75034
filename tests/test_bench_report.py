"""grpo_bench/analysis/bench_report.py: the goal checks read the right rows and compare the right way; the tables
and the figure by hand; each committed table is what the command it names writes from its JSON."""
import json

import pytest

from grpo_bench.analysis import bench_report

GPU, CPU = "NVIDIA H100 80GB HBM3", "AMD EPYC, 2 cores, 2 torch threads"


def row(kernel, mode, provider, n, v, dtype, ms, device, gb=0.0, peak=0.0):
    group = f"{kernel} {mode} N={n} V={v} {dtype} {device[:4]}"
    return {"stats": {"rounds": 20, "min": ms / 1e3, "median": ms / 1e3, "iqr": 0.0},
            "extra_info": {"kernel": kernel, "mode": mode, "group": group, "provider": provider, "n": n, "v": v,
                           "dtype": dtype, "gb_per_s": gb, "rows_per_s": 1.0, "peak_mem_mb": peak, "device": device,
                           "torch": "2.x", "load_avg": 0.0, "omp_wait_policy": ""}}


@pytest.fixture
def report(tmp_path):
    rows = [
        # GPU forward: triton at 2,700 GB/s, bound at 2,880 -> 94% of the bound, 0.9 of 3 TB/s
        row("logprob", "fwd", "bound", 16_384, 151_936, "bfloat16", 1.0, GPU, gb=2880),
        row("logprob", "fwd", "triton", 16_384, 151_936, "bfloat16", 1.0 / 0.9375, GPU, gb=2700),
        row("logprob", "fwd", "naive", 16_384, 151_936, "bfloat16", 20.0, GPU),
        # GPU fwd+bwd: 1.25x the bound -> missed
        row("logprob", "fwd+bwd", "bound", 16_384, 50_257, "bfloat16", 2.0, GPU),
        row("logprob", "fwd+bwd", "triton", 16_384, 50_257, "bfloat16", 2.5, GPU),
        row("logprob", "fwd+bwd", "naive", 16_384, 50_257, "bfloat16", 14.0, GPU),
        # GPU loss: 4x eager, 1.1x compile's time -> met, missed
        row("grpo_loss", "fwd+bwd", "torch", 1, 1, "float32", 4.0, GPU),
        row("grpo_loss", "fwd+bwd", "compile", 1, 1, "float32", 1.0 / 1.1, GPU),
        row("grpo_loss", "fwd+bwd", "triton", 1, 1, "float32", 1.0, GPU),
        # CPU forward at the CPU goals' case: chunked 2.5x naive, half of trl's speed-up goal
        row("logprob", "fwd", "naive", 4096, 50_257, "float32", 250.0, CPU, peak=800),
        row("logprob", "fwd", "chunked", 4096, 50_257, "float32", 100.0, CPU, peak=16),
        row("logprob", "fwd", "trl", 4096, 50_257, "float32", 150.0, CPU, peak=100),
    ]
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"datetime": "2026-11-22T00:00:00", "benchmarks": rows}))
    return bench_report.markdown(bench_report.load([path]))


def test_gpu_goals_read_the_gpu_rows(report):
    gpu = report.split("Goals (GPU):")[1].split("Goals")[0]
    assert "share of the measured bound: 0.938 (goal >= 0.9): **met**" in gpu
    assert "GB/s over 3.0 TB/s: 0.9 (goal >= 0.9): **met**" in gpu
    assert "triton time / three-pass bound: 1.25x (goal <= 1.2x): **missed**" in gpu
    assert "fused speed-up over eager torch: 4x (goal >= 3x): **met**" in gpu
    assert "fused time / torch.compile's: 1.1x (goal <= 1x): **missed**" in gpu
    assert "4096" not in gpu  # the CPU rows are not judged by the GPU goals


def test_cpu_goals_read_the_cpu_rows(report):
    cpu = report.split("Goals (CPU, fp32, N=4096, V=50,257, forward):")[1].split("Goals")[0]
    assert "chunked vs naive, forward speed-up: 2.5x (goal >= 2x): **met**" in cpu
    assert "chunked vs trl, forward speed-up: 1.5x (goal >= 3x): **missed**" in cpu
    assert "chunked peak extra memory / naive's: 0.02 (goal <= 0.1): **met**" in cpu


ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("where", ["results/kernels", "results/kernels/gpu"])
def test_committed_kernel_tables_are_what_bench_report_writes_from_their_json(where, tmp_path, monkeypatch, capsys):
    """Each committed benchmarks.md and .csv is, character for character, what the command its first line names
    writes from the committed JSON today; the figure is held by the digest of what it draws (in the .md)."""
    import re
    import sys
    committed = (ROOT / where / "benchmarks.md").read_text()
    words = re.match(r"Rebuild with `python -m grpo_bench\.analysis\.bench_report ([^`]*)`", committed).group(1)
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", ["bench_report", *words.split(), "--out", str(tmp_path)])
    bench_report.main()
    assert (tmp_path / "benchmarks.md").read_text() == committed == capsys.readouterr().out[:-1]
    assert (tmp_path / "benchmarks.csv").read_text() == (ROOT / where / "benchmarks.csv").read_text()
    assert (tmp_path / "benchmarks.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _write(tmp_path, rows, name="b.json", when="2026-11-22T00:00:00"):
    path = tmp_path / name
    path.write_text(json.dumps({"datetime": when, "benchmarks": rows}))
    return path


def test_load_keeps_the_kernel_rows_in_milliseconds_with_speed_ups_in_order(tmp_path):
    """Seconds become milliseconds, a benchmark of another suite (no provider) is left out, the speed-up is the
    baseline's median over the row's, and log-probs come first (by mode, V, N, median), then the loss."""
    other = {"stats": {"rounds": 1, "min": 1.0, "median": 1.0, "iqr": 0.0}, "extra_info": {}}
    loss = row("grpo_loss", "fwd+bwd", "torch", 1, 1, "float32", 4.0, CPU)
    loss["stats"] |= {"min": 0.003, "iqr": 0.0005}
    df = bench_report.load([_write(tmp_path, [loss, row("grpo_loss", "fwd+bwd", "triton", 1, 1, "float32", 1.0, CPU),
                                              other, row("logprob", "fwd", "chunked", 8, 5, "float32", 2.0, CPU),
                                              row("logprob", "fwd", "naive", 8, 5, "float32", 5.0, CPU)])])
    assert list(df.provider) == ["chunked", "naive", "triton", "torch"] and list(df.index) == [0, 1, 2, 3]
    torch_row = df[df.provider == "torch"].iloc[0]
    assert (torch_row.min_ms, torch_row.median_ms, torch_row.iqr_ms) == pytest.approx((3.0, 4.0, 0.5))
    assert list(df.speedup) == pytest.approx([2.5, 1.0, 4.0, 1.0])
    assert list(df.columns) == bench_report.COLUMNS and df.compile_s.isna().all()   # a column no row had
    with pytest.raises(SystemExit, match=r"^no kernel benchmarks in .*a\.json, .*c\.json$"):
        bench_report.load([_write(tmp_path, [other], "a.json"), _write(tmp_path, [], "c.json")])


def test_a_goal_at_its_target_is_met_either_way():
    lines = []
    bench_report._check(lines, "up", 3.0, 3)
    bench_report._check(lines, "down", 0.1, 0.1, higher=False, unit="")
    bench_report._check(lines, "over", 0.11, 0.1, higher=False, unit="")
    assert lines == ["- up: 3x (goal >= 3x): **met**", "- down: 0.1 (goal <= 0.1): **met**",
                     "- over: 0.11 (goal <= 0.1): **missed**"]


def test_goals_read_only_their_own_case(tmp_path):
    """The CPU goals' case is one mode, N, V and dtype: rows that share all but one are not read; without both
    chunked and naive there is no case. The GPU goals likewise, group by group in the table's order."""
    near = [row("logprob", mode, p, n, v, dt, ms, CPU) for mode, n, v, dt in
            [("fwd+bwd", 4096, 50_257, "float32"), ("fwd", 2048, 50_257, "float32"),
             ("fwd", 4096, 32_000, "float32"), ("fwd", 4096, 50_257, "bfloat16")]
            for p, ms in [("naive", 900.0), ("chunked", 1.0)]]
    df = bench_report.load([_write(tmp_path, near + [row("logprob", "fwd", "chunked", 4096, 50_257, "float32",
                                                         100.0, CPU)])])
    assert bench_report.goals(df) == ["- the N=4096, V=50,257 fp32 forward case is not in this run."]
    gpu = [row("logprob", "fwd", "triton", 8192, 151_936, "bfloat16", 1.0, GPU, gb=100),
           row("logprob", "fwd", "triton", 16_384, 151_936, "float32", 1.0, GPU, gb=100),
           row("logprob", "fwd", "triton", 16_384, 50_257, "bfloat16", 1.0, GPU, gb=100),
           row("logprob", "fwd+bwd", "triton", 16_384, 151_936, "bfloat16", 3.0, GPU),
           row("logprob", "fwd+bwd", "bound", 16_384, 151_936, "bfloat16", 2.0, GPU),
           row("logprob", "fwd+bwd", "triton", 16_384, 50_257, "bfloat16", 1.0, GPU),   # no bound: no goal
           # the table's order (V before N) is not the names' alphabetical one
           row("grpo_loss", "fwd+bwd", "triton", 9, 1, "float32", 1.0, GPU),
           row("grpo_loss", "fwd+bwd", "compile", 9, 1, "float32", 2.0, GPU),
           row("grpo_loss", "fwd+bwd", "triton", 1, 2, "float32", 1.0, GPU),
           row("grpo_loss", "fwd+bwd", "torch", 1, 2, "float32", 2.0, GPU),
           row("logprob", "fwd", "naive", 4096, 50_257, "float32", 1.0, CPU),
           row("logprob", "fwd", "chunked", 4096, 50_257, "float32", 1.0, CPU)]
    assert bench_report.gpu_goals(bench_report.load([_write(tmp_path, gpu)])) == [
        "- logprob fwd+bwd N=16384 V=151936 bfloat16 NVID: triton time / three-pass bound: 1.5x (goal <= 1.2x): "
        "**missed**",
        "- grpo_loss fwd+bwd N=9 V=1 float32 NVID: fused time / torch.compile's: 0.5x (goal <= 1x): **met**",
        "- grpo_loss fwd+bwd N=1 V=2 float32 NVID: fused speed-up over eager torch: 2x (goal >= 3x): **missed**"]


def test_step_goals_per_case_in_the_tables_order(tmp_path):
    step = lambda p, b, ms, peak: {  # noqa: E731
        "stats": {"rounds": 3, "min": ms / 1e3, "median": ms / 1e3, "iqr": 0.0},
        "extra_info": {"kernel": "lm_step", "mode": "fwd+bwd", "group": f"GRPO step {'small' if b < 8 else 'large'}",
                       "provider": p, "n": b,
                       "v": 8, "dtype": "float32", "gb_per_s": 0.0, "rows_per_s": 1.0, "peak_mem_mb": peak,
                       "device": CPU, "torch": "2.x", "load_avg": 0.5, "omp_wait_policy": ""}}
    df = bench_report.load([_write(tmp_path, [step("fused", 32, 50.0, 8.0), step("fused", 2, 12.0, 5.0),
                                              step("materialised", 2, 10.0, 100.0)])])
    assert bench_report.step_goals(df) == [
        "- GRPO step small: fused peak extra memory / materialised's: 0.05 (goal <= 0.1): **met**",
        "- GRPO step small: fused time / materialised's: 1.2x (goal <= 1.2x): **met**",
        "- GRPO step large: materialised path not measured (skipped: not enough memory for it here)"]


XEON = "Xeon, 2 cores, 2 torch threads"   # after NVIDIA in sorted order: the headers keep the table's


def test_the_markdown_of_two_runs_by_hand(tmp_path):
    a = [row("logprob", "fwd", "bound", 4096, 50_257, "float32", 50.0, XEON, gb=16.0),
         row("logprob", "fwd", "naive", 4096, 50_257, "float32", 250.0, XEON, peak=800),
         row("logprob", "fwd", "chunked", 4096, 50_257, "float32", 100.0, XEON, gb=8.0, peak=16)]
    a[0]["extra_info"]["load_avg"], a[1]["extra_info"]["load_avg"] = 3.14, 1.0
    for r in a:
        r["extra_info"]["omp_wait_policy"] = "PASSIVE"
    b = [row("grpo_loss", "fwd+bwd", "torch", 1, 1, "float32", 4.0, GPU),
         row("grpo_loss", "fwd+bwd", "triton", 1, 1, "float32", 1.0, GPU)]
    for r in b:   # a run from before the benchmarks recorded the policy
        del r["extra_info"]["omp_wait_policy"]
    df = bench_report.load([_write(tmp_path, a, "a.json"), _write(tmp_path, b, "b.json", "2026-11-23T01:02:03.45")])
    assert bench_report.markdown(df) == f"""\
Device: {XEON}; torch 2.x; run 2026-11-22T00:00:00 (logprob); load average 0.0-3.1; OMP_WAIT_POLICY=PASSIVE  
Device: {GPU}; torch 2.x; run 2026-11-23T01:02:03 (grpo_loss); load average 0.0-0.0  

**logprob fwd N=4096 V=50257 float32 Xeon**

| provider | median ms | min ms | rows/s | GB/s | peak extra MB | x naive | of bound |
|---|---:|---:|---:|---:|---:|---:|---:|
| bound | 50.00 | 50.00 | 1 | 16.00 | 0.0 | 5.00 | 100% |
| chunked | 100.00 | 100.00 | 1 | 8.00 | 16.0 | 2.50 | 50% |
| naive | 250.00 | 250.00 | 1 | 0.00 | 800.0 | 1.00 | 20% |

**grpo_loss fwd+bwd N=1 V=1 float32 NVID**

| provider | median ms | min ms | rows/s | GB/s | peak extra MB | x torch | of bound |
|---|---:|---:|---:|---:|---:|---:|---:|
| triton | 1.00 | 1.00 | 1 | 0.00 | 0.0 | 4.00 | — |
| torch | 4.00 | 4.00 | 1 | 0.00 | 0.0 | 1.00 | — |

Goals (CPU, fp32, N=4096, V=50,257, forward):
- chunked vs naive, forward speed-up: 2.5x (goal >= 2x): **met**
- chunked peak extra memory / naive's: 0.02 (goal <= 0.1): **met**

Goals (GPU):
- grpo_loss fwd+bwd N=1 V=1 float32 NVID: fused speed-up over eager torch: 4x (goal >= 3x): **met**

"""
    # each goal section only where its rows are: a CPU loss alone has none, a CPU log-prob no GPU goals
    assert "Goals" not in bench_report.markdown(df[df.kernel == "grpo_loss"].assign(device=CPU))
    assert "Goals (GPU)" not in bench_report.markdown(df[df.kernel == "logprob"])


def test_the_figure_draws_each_cases_speed_ups_with_its_bound(tmp_path):
    """A panel per case that has its baseline (a case without one has no speed-up to draw), bars of the speed-ups
    without the bound's, a solid line at 1 and the bound dashed where measured, the devices in the title."""
    import matplotlib
    import matplotlib.pyplot as plt
    rows = [row("logprob", "fwd", "bound", 8, 5, "float32", 1.0, CPU),
            row("logprob", "fwd", "naive", 8, 5, "float32", 4.0, CPU),
            row("logprob", "fwd", "chunked", 8, 5, "float32", 2.0, CPU),
            row("grpo_loss", "fwd+bwd", "torch", 1, 1, "float32", 3.0, CPU),
            row("grpo_loss", "fwd+bwd", "triton", 1, 1, "float32", 1.0, CPU),
            row("grpo_loss", "fwd", "triton", 1, 1, "float32", 1.0, CPU)]   # its baseline (torch) not measured
    for r in rows:
        r["extra_info"]["omp_wait_policy"] = "PASSIVE"
    rows[-1]["extra_info"]["device"] = GPU   # a second machine, named in the title too
    grid = bench_report.draw(bench_report.load([_write(tmp_path, rows)]))
    try:
        panels = {ax.get_title(): ax for ax in grid.axes.flat if ax.get_title()}
        assert list(panels) == ["logprob fwd N=8 V=5 float32 AMD ", "grpo_loss fwd+bwd N=1 V=1 float32 AMD "]
        lp, loss = panels.values()
        assert sorted(round(p.get_width(), 6) for p in lp.patches) == [1.0, 2.0]
        assert sorted(round(p.get_width(), 6) for p in loss.patches) == [1.0, 3.0]
        assert [(tuple(line.get_xdata()), line.get_linestyle()) for line in lp.lines[-2:]] == \
            [((1.0, 1.0), "-"), ((4.0, 4.0), "--")]
        assert [t.get_text() for t in lp.get_legend().get_texts()] == ["memory bound"] and loss.get_legend() is None
        assert lp.get_xlabel() == "speed-up over baseline (median time)" and lp.get_ylabel() == ""
        title = grid.figure._suptitle
        assert title.get_text() == f"{CPU}, OMP_WAIT_POLICY=PASSIVE; {GPU}, OMP_WAIT_POLICY=PASSIVE"
        assert title.get_position()[1] == pytest.approx(1.02)
        assert len([ax for ax in grid.axes.flat if ax.get_visible()]) == 2
        # panels 2.6 in high, 1.5 times as wide, each with its own speed-up scale, seaborn's white grid, small type
        width, height = grid.figure.get_size_inches()
        assert height == pytest.approx(2.6) and width == pytest.approx(3 * 2.6 * 1.5, rel=0.02)   # 3 a row
        assert {matplotlib.colors.to_hex(p.get_facecolor()) for p in [*lp.patches, *loss.patches]} == {"#0072b2"}
        assert matplotlib.colors.to_hex(lp.lines[-1].get_color()) == "#d55e00"
        assert lp.get_xlim() != loss.get_xlim()
        assert lp.xaxis.label.get_fontsize() == pytest.approx(0.8 * 12) and lp.get_facecolor()[:3] == (1, 1, 1)
        assert any(line.get_visible() for line in lp.get_xgridlines())
    finally:
        plt.close(grid.figure)


def test_the_saved_figure_keeps_the_bars_and_bounds_colours_exact_and_closes(tmp_path):
    import matplotlib.pyplot as plt
    from PIL import Image
    grid = bench_report.draw(bench_report.load([_write(tmp_path, [
        row("logprob", "fwd", "bound", 8, 5, "float32", 1.0, CPU), row("logprob", "fwd", "naive", 8, 5, "float32",
                                                                       4.0, CPU)])]))
    bench_report.save(grid, tmp_path / "b.png")
    assert not plt.fignum_exists(grid.figure.number)
    with Image.open(tmp_path / "b.png") as im:
        colours = {tuple(c) for _, c in im.convert("RGB").getcolors(1 << 16)}
    assert (0x00, 0x72, 0xB2) in colours   # the bars' PALETTE[0], exact (not seaborn's desaturated blue)



def test_help_says_what_it_does(monkeypatch, capsys):
    import sys
    monkeypatch.setattr(sys, "argv", ["bench_report", "--help"])
    with pytest.raises(SystemExit):
        bench_report.main()
    assert "Turn pytest-benchmark JSON from tests/benchmarks into a table, a plot and the goal checks." in \
        " ".join(capsys.readouterr().out.split())


def test_main_writes_beside_the_first_json_by_default(tmp_path, monkeypatch, capsys):
    import sys
    from PIL import Image
    path = _write(tmp_path, [row("logprob", "fwd", "naive", 8, 5, "float32", 4.0, CPU),
                             row("logprob", "fwd", "chunked", 8, 5, "float32", 2.0, CPU)])
    monkeypatch.setattr(sys, "argv", ["bench_report", str(path)])
    bench_report.main()
    md = (tmp_path / "benchmarks.md").read_text()
    assert md.startswith(f"Rebuild with `python -m grpo_bench.analysis.bench_report {path}`.\n\n")
    assert md.endswith(" -->\n") and "<!-- benchmarks.png: figure data " in md and capsys.readouterr().out == md + "\n"
    assert (tmp_path / "benchmarks.csv").read_text().splitlines()[1].split(",")[8:10] == ["2", "2"]
    assert Image.open(tmp_path / "benchmarks.png").mode == "P"   # shrunk to the palette
    monkeypatch.setattr(sys, "argv", ["bench_report", str(path), "--out", str(tmp_path / "new" / "dir")])
    bench_report.main()
    assert (tmp_path / "new" / "dir" / "benchmarks.md").read_text() == md


def test_drawing_leaves_the_process_style_alone(tmp_path):
    """The theme is the figure's own: set for good, it restyled every later figure of the test worker, and the
    reports drawn there after it no longer matched their committed bytes."""
    import matplotlib
    import matplotlib.pyplot as plt
    before = dict(matplotlib.rcParams)
    grid = bench_report.draw(bench_report.load([_write(tmp_path, [row("logprob", "fwd", "naive", 8, 5, "float32",
                                                                      4.0, CPU)])]))
    plt.close(grid.figure)
    assert dict(matplotlib.rcParams) == before
