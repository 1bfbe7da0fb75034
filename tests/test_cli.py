"""The command line. Bad input: exit code 2 and one line naming the file, the key and the valid choices. And, in
this process, what `run` hands the runner, and what each command prints and returns."""
import os
import socket
import sys
from pathlib import Path

import pytest
import yaml

from grpo_bench import registry
from grpo_bench.__main__ import main
from grpo_bench.errors import ConfigError
from grpo_bench.config.ablation import load_ablation
from grpo_bench.store.rundir import lock_out
from helpers import cli, needs

LOSSES = "valid: " + ", ".join(registry.names("loss"))
DELTAS = "valid: " + ", ".join(registry.names("delta"))

BASE = {"task": {"name": "sort"}, "epochs": 2, "inner_steps": 1}


def write(tmp_path, doc, name="abl.yaml"):
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return p


CASES = [
    # (ablation document, words the one-line error must contain)
    ({"base": {**BASE, "loss": "ppo"}, "grid": {"seed": [0]}}, ["loss", "'ppo'", LOSSES]),
    ({"base": BASE, "grid": {"delta": ["zscore", "whiten"]}}, ["delta", "'whiten'", DELTAS]),
    ({"base": {**BASE, "lr_rate": 0.1}, "grid": {"seed": [0]}}, ["lr_rate", "unknown key", "valid:", "inner_steps"]),
    ({"base": {**BASE, "epochs": "ten"}, "grid": {"seed": [0]}}, ["epochs", "expected int", "'ten'"]),
    ({"base": {**BASE, "group_size": 1}, "grid": {"delta": ["zscore"]}}, ["group_size", ">= 2", "zscore"]),
    ({"base": {**BASE, "loss": {"name": "clipped", "clip_low": 0.0}}, "grid": {"seed": [0]}}, ["loss.clip_low", "must be > 0"]),
    ({"base": {**BASE, "loss": {"name": "clipped", "clip_high": -0.1}}, "grid": {"seed": [0]}}, ["loss.clip_high", "must be > 0"]),
    ({"base": {**BASE, "loss": {"name": "clipped", "tau": 1}}, "grid": {"seed": [0]}},
     ["loss.tau", "no parameter 'tau'", "valid: clip_low, clip_high"]),
    ({"base": {**BASE, "loss": {"name": "sapo", "tau_pos": "hot"}}, "grid": {"seed": [0]}}, ["loss.tau_pos", "expected float"]),
    ({"base": {**BASE, "loss": {"clip_high": 0.3}}, "grid": {"seed": [0]}}, ["loss.name", "missing", LOSSES]),
    ({"base": {**BASE, "filters": ["dynamic_sampling", "shuffle"]}, "grid": {"seed": [0]}},
     ["filters.1", "unknown filter 'shuffle'", "valid: dynamic_sampling"]),
    ({"base": {**BASE, "group_size": 1, "delta": "raw", "filters": ["dynamic_sampling"]}, "grid": {"seed": [0]}},
     ["group_size", "filters.0 'dynamic_sampling'"]),
    ({"base": {**BASE, "delta": {"name": "gpg", "count": "tokens"}}, "grid": {"seed": [0]}},
     ["delta.count", "valid: advantage, reward"]),
    ({"base": {**BASE, "ref_update": {"name": "soft", "alpha": 1.5}}, "grid": {"seed": [0]}}, ["ref_update.alpha", "<= 1"]),
    ({"base": {**BASE, "kl_coef": -0.5}, "grid": {"seed": [0]}}, ["kl_coef", ">= 0"]),
    ({"base": BASE, "grid": {}}, ["grid", "empty"]),
    ({"base": BASE, "grid": {"loss": []}}, ["grid.loss", "non-empty list"]),
    ({"base": BASE, "grid": {"seed": [0]}, "seed": 3}, [": seed: unknown key", "valid: name, description, include, claim, settings, base, grid, variants, seeds, resources"]),
    ({"base": {**BASE, "task": {"name": "sorting"}}, "grid": {"seed": [0]}},
     ["task.name", "valid: arithmetic, gym, sort (tasks); arithmetic_qwen, arithmetic_scratchpad, arithmetic_scratchpad_wide, arithmetic_tiny, countdown, smollm2_arithmetic, smollm2_countdown, smollm2_countdown_warm, smollm2_letter_counting, smollm2_spell_backward, sort_converge, sort_hard, sort_lecture, spell_backward (presets"]),
    ({"base": {**BASE, "task": {"name": "sort", "size": 3}}, "grid": {"seed": [0]}}, ["task.size", "unknown key", "vocab"]),
    ({"base": {**BASE, "task": {"name": "sort", "rewards": {"l2": 1}}}, "grid": {"seed": [0]}},
     ["task.rewards", "unknown reward 'l2' for task sort; valid: inclusion_order, match"]),
    ({"base": {**BASE, "task": {"name": "arithmetic_tiny", "sampling": {"temperature": -1}}}, "grid": {"seed": [0]}},
     ["task.sampling.temperature", "must be > 0"]),
    ({"base": {**BASE, "kl_placement": "advantage"}, "grid": {"seed": [0]}}, ["kl_placement", "valid: loss, reward"]),
    ({"base": BASE, "grid": {"seed": [0]}, "seeds": 0}, ["seeds", "positive int"]),
    ("base: [unclosed\n", ["invalid YAML"]),
    ({"base": BASE, "grid": {"seed": [0]}, "resources": {"gpu": 1}}, ["resources.gpu", "unknown key", "valid: cpus, gpus"]),
    ({"base": BASE, "grid": {"seed": [0]}, "resources": {"cpus": 0}}, ["resources.cpus", "got 0"]),
    ({"base": BASE, "grid": {"seed": [0]}, "resources": {"gpus": 1.5}}, ["resources.gpus", "whole number", "1.5"]),
    ({"base": BASE, "grid": {"seed": [0]}, "resources": {"gpus": -0.5}}, ["resources.gpus", "-0.5"]),
    ({"base": BASE, "grid": {"seed": [0]}, "resources": 2}, ["resources", "expected a mapping"]),
]


@pytest.mark.parametrize("doc,words", CASES, ids=[str(i) for i in range(len(CASES))])
def test_bad_ablation_is_one_line_exit_2(tmp_path, doc, words, capsys):
    # in-process, so that 25 cases cost no interpreter start-ups; an exception escaping
    # main() (what would print a traceback) fails the test, and test_bad_set_and_missing_file
    # checks the same behaviour through a real process
    path = write(tmp_path, doc)
    code = main(["run", str(path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert str(path) in lines[0] or "--set" in lines[0]
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert not (tmp_path / "out").exists()


def test_bad_set_and_missing_file(tmp_path):
    res = cli("run", "ablations/loss_modes.yaml", "--set", "loss=nope", "--out", tmp_path / "o")
    assert res.returncode == 2 and LOSSES in res.stderr
    res = cli("run", "ablations/delta_modes.yaml", "--set", "loss.clip_high=-1", "--out", tmp_path / "o")
    assert res.returncode == 2 and "loss.clip_high: must be > 0" in res.stderr
    res = cli("run", "ablations/loss_modes.yaml", "--set", "loss", "--out", tmp_path / "o")
    assert res.returncode == 2 and "key=value" in res.stderr
    res = cli("run", tmp_path / "missing.yaml")
    assert res.returncode == 2 and "missing.yaml" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    res = cli("plot", tmp_path)
    assert res.returncode == 2 and "not a results directory" in res.stderr


def test_list_prints_every_part():
    res = cli("list")
    assert res.returncode == 0
    for axis in registry.AXES:
        for name in registry.names(axis):
            assert f"  {name} " in res.stdout, name
    assert "clip_high=0.2" in res.stdout and "source: DAPO" in res.stdout



def test_resources_from_file_and_set(tmp_path):
    path = write(tmp_path, {"base": BASE, "grid": {"seed": [0]}, "resources": {"gpus": 0.25}})
    assert load_ablation(path).resources == {"cpus": 1, "gpus": 0.25}
    abl = load_ablation(path, sets=["resources.cpus=2", "resources.gpus=1", "epochs=3"])
    assert abl.resources == {"cpus": 2, "gpus": 1}
    assert all(raw["epochs"] == 3 and "resources" not in raw for _, _, raw in abl.variants)
    with pytest.raises(ConfigError, match=r"^--set: resources.cpus: .*'x'"):
        load_ablation(path, sets=["resources.cpus=x"])


@pytest.mark.parametrize("executor", ["local", "ray"])
def test_busy_or_unwritable_out_is_one_line(tmp_path, capsys, executor):
    if executor == "ray":
        needs("ray")  # without it, `Ray is not installed` comes first (the next test)
    path = write(tmp_path, {"base": BASE, "grid": {"seed": [0]}})
    out = tmp_path / "o"

    def run(out):
        assert main(["run", str(path), "--out", str(out), "--executor", executor, "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        return err

    with lock_out(out):  # as a running sweep holds it
        err = run(out)
    assert f"--out: {out}: another sweep (pid {os.getpid()}) is writing here" in err
    assert not (out / "ablation.json").exists()
    (tmp_path / "file").write_text("")
    for bad in ["/proc/grpo_bench_out", tmp_path / "file" / "o"]:
        assert f"--out: {bad}: cannot create or write the output directory" in run(bad)


def test_ray_missing_or_unreachable_is_one_line(tmp_path, monkeypatch, capsys):
    path = write(tmp_path, {"base": BASE, "grid": {"seed": [0]}})
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets where Ray is not installed
    assert main(["run", str(path), "--out", str(tmp_path / "o"), "--executor", "ray"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Ray is not installed" in err and "pip install -e '.[ray]'" in err
    assert not (tmp_path / "o").exists()
    monkeypatch.undo()

    needs("ray")
    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = cli("run", path, "--out", tmp_path / "o", "--address", f"127.0.0.1:{port}", timeout=60)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert f"--address: 127.0.0.1:{port}: cannot reach a Ray cluster" in res.stderr


def test_executor_options_that_contradict(tmp_path, capsys):
    path = str(write(tmp_path, {"base": BASE, "grid": {"seed": [0]}}))
    assert main(["run", path, "--executor", "ray", "--workers", "2", "--out", str(tmp_path / "o")]) == 2
    assert "--workers" in capsys.readouterr().err
    assert main(["run", path, "--executor", "local", "--address", "auto", "--out", str(tmp_path / "o")]) == 2
    assert "is for --executor ray" in capsys.readouterr().err
    assert main(["run", path, "--executor", "ray", "--max-retries", "-1", "--out", str(tmp_path / "o")]) == 2
    assert "--max-retries" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


# --- the command line's own decisions, in this process (the CLI tests above mostly start `python -m grpo_bench`,
# where mutation testing cannot see which line ran): what reaches the runner, exit codes and what each prints

def test_seeds_as_written_by_hand():
    from grpo_bench.__main__ import parse_seeds
    # auto's cap is 40 as --help and docs/statistics.md say; 1 seed and a cap of 3 (the paired test's minimum) run
    for text, expect in [(None, (None, False)), ("1", (1, False)), (" 7 ", (7, False)), ("auto", (40, True)),
                         ("auto:3", (3, True)), ("auto:12", (12, True))]:
        assert parse_seeds(text) == expect, text
    for text, words in [("0", "must be >= 1, got 0"), ("-2", "must be >= 1, got -2"),
                        ("auto:2", "a cap of at least 3 seeds"), ("auto:", "expected N"), ("five", "expected N")]:
        with pytest.raises(ConfigError, match=f"^--seeds: seeds: .*{words}"):
            parse_seeds(text)


def test_an_os_errors_line_names_the_file_only_with_its_reason():
    import errno
    from grpo_bench.__main__ import _os_error
    assert _os_error(OSError(errno.ENOSPC, "No space left on device", "out/s.csv")) == "out/s.csv: No space left on device"
    named = OSError("the disk went away")
    named.filename = "out/s.csv"   # a file but no strerror: the message as raised, not "out/s.csv: None"
    assert _os_error(named) == str(named) != "out/s.csv: None"
    assert _os_error(OSError(errno.EROFS, "Read-only file system")) == "[Errno 30] Read-only file system"


def test_help_opens_with_the_modules_first_line_and_a_command_is_required(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    assert "Command line: `python -m grpo_bench {run,plot,compare,gallery,findings,list,build-start}`." \
        in " ".join(capsys.readouterr().out.split())   # as argparse wraps it to the terminal
    with pytest.raises(SystemExit) as e:
        main([])
    assert e.value.code == 2 and "the following arguments are required: cmd" in capsys.readouterr().err


@pytest.fixture
def runner(monkeypatch, tmp_path):
    """`run` with the sweep and its report stood in for: what the command line hands the runner, in which order
    it pins the CPU, the SIGTERM handler it runs under, and what it prints and returns for what the runner does."""
    import signal
    import threading

    import pandas as pd

    from grpo_bench.analysis import report
    from grpo_bench.numerics import cpu
    from grpo_bench.store import rundir
    from grpo_bench.sweep import runner as sweep_runner

    calls = {"order": [], "runs": [], "had": None, "status": ["ok", "ok"], "raise": None}

    def run_ablation(abl, out, **kw):
        calls["order"].append("run")
        calls["runs"].append((abl.name, Path(out), kw, signal.getsignal(signal.SIGTERM),
                              threading.current_thread() is threading.main_thread()))
        if calls["raise"] is not None:
            raise calls["raise"]
        return pd.DataFrame({"status": calls["status"]})

    monkeypatch.setattr(cpu, "pin", lambda: calls["order"].append("pin"))
    monkeypatch.setattr(sweep_runner, "run_ablation", run_ablation)
    monkeypatch.setattr(report, "make_report", lambda out: Path(out) / "REPORT.md")
    monkeypatch.setattr(rundir, "finished_in_report", lambda path: calls["had"])
    monkeypatch.delenv("GRPO_BENCH_CPU_PIN", raising=False)
    calls["file"] = write(tmp_path, {"name": "c", "base": BASE, "grid": {"seed": [0]}})
    return calls


def test_run_hands_the_runner_the_documented_defaults_after_pinning_the_cpu(runner, tmp_path, capsys):
    import signal

    from grpo_bench.__main__ import _terminate
    def callers(signum, frame):  # a handler of the caller's own, which no earlier main() could have left
        pass

    before = signal.signal(signal.SIGTERM, callers)
    try:
        assert main(["run", str(runner["file"]), "--out", str(tmp_path / "o")]) == 0
        after = signal.getsignal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, before)
    (name, out, kw, handler, _), = runner["runs"]
    assert (name, out) == ("c", tmp_path / "o")
    assert kw == {"executor": "local", "workers": None, "threads": None, "address": None, "max_retries": 3,
                  "progress": True, "population": None, "log_to": (), "sequential": False, "force": False}
    # the pin comes first, and the workers this process spawns are told to pin too
    assert runner["order"] == ["pin", "run"] and os.environ["GRPO_BENCH_CPU_PIN"] == "1"
    # a SIGTERM during the sweep ends it as Ctrl-C does; the caller's handler is back afterwards
    assert handler is _terminate and after is callers
    assert capsys.readouterr().out == f"c: 2 runs ok, 0 failed; report: {tmp_path / 'o' / 'REPORT.md'}\n"


def test_run_takes_the_smallest_values_each_option_allows(runner, tmp_path, capsys):
    assert main(["run", str(runner["file"]), "--out", str(tmp_path / "o"), "--workers", "1", "--threads", "1",
                 "--population", "1", "--max-retries", "0", "--seeds", "auto:3", "--no-progress", "--force"]) == 0
    kw = runner["runs"][0][2]
    assert (kw["workers"], kw["threads"], kw["population"], kw["max_retries"], kw["sequential"], kw["progress"],
            kw["force"]) == (1, 1, 1, 0, True, False, True)
    for option, value in [("--workers", "0"), ("--threads", "0"), ("--population", "0"), ("--max-retries", "-1")]:
        assert main(["run", str(runner["file"]), "--out", str(tmp_path / "o"), option, value]) == 2
        assert capsys.readouterr().err.startswith(f"error: {option}: "), option
    assert len(runner["runs"]) == 1


def test_run_in_a_thread_leaves_signals_alone(runner, tmp_path):
    """Python lets only the main thread set a signal handler: a run started from another thread (a notebook's
    worker, a test) runs without the SIGTERM handler instead of failing."""
    import threading
    codes = []
    t = threading.Thread(target=lambda: codes.append(main(["run", str(runner["file"]), "--out", str(tmp_path / "o"),
                                                           "--no-progress"])))
    t.start()
    t.join(60)
    assert codes == [0] and runner["runs"][0][4] is False


def test_an_unknown_tracker_is_refused_before_any_run(runner, tmp_path, capsys):
    assert main(["run", str(runner["file"]), "--out", str(tmp_path / "o"), "--log-to", "neptune"]) == 2
    assert capsys.readouterr().err.startswith("error: --log-to: neptune: unknown tracker; valid: tensorboard")
    assert runner["runs"] == []


def test_each_setting_gets_its_own_directory_and_the_default_is_under_results(runner, tmp_path, monkeypatch):
    doc = {"name": "c", "settings": {"sort": {"epochs": 2}, "hard": {"task": "sort_hard"}},
           "base": {"inner_steps": 1}, "variants": {"x": {}}, "seeds": 1}
    path = write(tmp_path, doc, "two.yaml")
    assert main(["run", str(path), "--out", str(tmp_path / "o"), "--no-progress"]) == 0
    assert [(n, o) for n, o, *_ in runner["runs"]] == [("c_hard", tmp_path / "o" / "c_hard"),   # the file's order
                                                       ("c_sort", tmp_path / "o" / "c_sort")]
    runner["runs"].clear()
    assert main(["run", str(path), "--setting", "hard", "--out", str(tmp_path / "o"), "--no-progress"]) == 0
    assert [(n, o) for n, o, *_ in runner["runs"]] == [("c_hard", tmp_path / "o")]
    runner["runs"].clear()
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(runner["file"]), "--no-progress"]) == 0
    assert runner["runs"][0][1] == Path("results") / "c"


@pytest.mark.parametrize("fault,code,line", [
    (KeyboardInterrupt(), 130, "interrupted: finished runs are kept in {runs}; run the same command again to resume"),
    ("terminated", 143, "terminated: finished runs are kept in {runs}; run the same command again to resume"),
    ("lost", 1, "error: worker lost: run x-s0; finished runs are kept in {runs}; run the same command again to resume"),
    (OSError(28, "No space left on device", "o/summary.csv"), 1,
     "error: cannot write o/summary.csv: No space left on device; finished runs are kept in {runs}; run the same "
     "command again to resume")])
def test_what_stops_a_sweep_is_one_line_and_its_exit_code(runner, tmp_path, capsys, fault, code, line):
    from grpo_bench.__main__ import Terminated
    from grpo_bench.sweep.worker import WorkerLost
    runner["raise"] = {"terminated": Terminated(), "lost": WorkerLost("worker lost: run x-s0")}.get(fault, fault)
    assert main(["run", str(runner["file"]), "--out", str(tmp_path / "o"), "--no-progress"]) == code
    assert capsys.readouterr().err == line.format(runs=tmp_path / "o" / "runs") + "\n"


@pytest.mark.parametrize("status,had,code,err", [
    ([], None, 0, ""),      # nothing in the plan left to run: no run failed
    (["ok", "ok"], 2, 0, ""),   # as many finished runs as the report it replaces
    (["ok", "failed"], 2, 1, "note: {report} now has 1 finished runs (it had 2): this plan has fewer runs than the "
     "one reported before\nerror: 1 of 2 runs failed; their errors are in {report}\n")])
def test_the_summary_line_and_the_notes_after_a_sweep(runner, tmp_path, capsys, status, had, code, err):
    runner["status"], runner["had"] = status, had
    assert main(["run", str(runner["file"]), "--out", str(tmp_path / "o"), "--no-progress"]) == code
    out = capsys.readouterr()
    report = tmp_path / "o" / "REPORT.md"
    ok = status.count("ok")
    assert out.out == f"c: {ok} runs ok, {len(status) - ok} failed; report: {report}\n"
    assert out.err == err.format(report=report)


def test_findings_judges_the_rule_changes_again_only_where_they_are_written(monkeypatch, tmp_path, capsys):
    from grpo_bench.analysis import findings_text, rule_changes
    calls = []
    monkeypatch.setattr(rule_changes, "main", lambda argv: calls.append(("rules", argv)))
    monkeypatch.setattr(findings_text, "write_findings", lambda root, out: calls.append(("findings", root, out)) or "w")
    assert main(["findings", str(tmp_path)]) == 0
    assert calls == [("findings", tmp_path, None)]
    (tmp_path / findings_text.RULES_FILE).write_text("")
    calls.clear()
    assert main(["findings", str(tmp_path), "--out", str(tmp_path / "F.md")]) == 0
    assert calls == [("rules", [str(tmp_path)]), ("findings", tmp_path, tmp_path / "F.md")]


def test_list_names_a_users_part_with_its_file_and_each_preset_by_its_first_sentence(tmp_path, capsys,
                                                                                     registry_restored):
    from grpo_bench.config import presets
    (tmp_path / "mine.py").write_text(
        "from grpo_bench.registry import register\n\n"
        "@register('loss', 'listed_loss')\n"
        "def listed_loss(logp, old_logp, deltas, mask, *, scale: float = 2.0):\n"
        "    \"\"\"-scale * A.\n\n    Source: a test.\n    \"\"\"\n    return -scale * deltas[..., None] + 0 * logp, {}\n")
    assert main(["list", "--include", str(tmp_path / "mine.py")]) == 0
    lines = capsys.readouterr().out.splitlines()
    i = next(k for k, line in enumerate(lines) if line.strip().startswith("listed_loss"))
    assert "scale=2.0" in lines[i + 1] and lines[i + 3].strip() == f"file: {tmp_path / 'mine.py'}"
    listed = lines[lines.index(f"presets ({registry.tasks_dir()}):") + 1:]
    assert [line.split()[0] for line in listed] == presets.names()
    # the description's first sentence, not the whole of it (arithmetic_tiny's has two)
    assert ("  arithmetic_tiny          [arithmetic] Two-digit addition (`17+25=` -> `42<eos>`) on the embedded tiny "
            "GPT-2 (2 layers, width 128, character tokenizer), starting from the warm-started checkpoint shipped in "
            "tasks/arithmetic_tiny/ (identical on every machine; see its manifest.json for its held-out "
            "accuracy).") in listed
