"""Command line: `python -m grpo_bench {run,plot,compare,gallery,findings,list,build-start}`.

Bad input (unknown part, key, type or value; a damaged results file) ends with exit
code 2 and one line naming the file, the key and the valid choices, never a traceback.
Exit 1: a run failed, a worker was lost, or a file could not be written (full disk,
read-only); 130 on Ctrl-C and 143 on SIGTERM, finished runs kept either way.
"""
from __future__ import annotations

import argparse
import re
import signal
import sys
import threading
from pathlib import Path

from .errors import ConfigError
from .config.ablation import ablation_settings, load_ablation


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is, so that a sweep ends as it does on Ctrl-C."""


def _terminate(signum, frame):
    raise Terminated()


# --seeds auto's cap: at 40 pairs the sequential test finds a difference of half the sd of a paired
# difference 73% of the time (tests/test_stats.py), and the seeds a sweep may spend stay bounded
AUTO_CAP = 40


def parse_seeds(text: str | None) -> tuple[int | None, bool]:
    """--seeds as written -> (number of seeds, sequential): N -> (N, False), auto -> (AUTO_CAP, True),
    auto:CAP -> (CAP, True); ConfigError naming --seeds otherwise."""
    if text is None:
        return None, False
    t = text.strip()
    sequential = t == "auto" or t.startswith("auto:")
    number = t.removeprefix("auto:") if sequential and t != "auto" else str(AUTO_CAP) if sequential else t
    if not re.fullmatch(r"[+-]?\d+", number):
        raise ConfigError("--seeds", "seeds", f"expected N (seeds 0..N-1), auto or auto:CAP (at most CAP seeds, "
                          f"chosen sequentially; default {AUTO_CAP}), got {text!r}")
    n = int(number)
    if not sequential and n < 1:
        raise ConfigError("--seeds", "seeds", f"must be >= 1, got {n}")
    if sequential and n < 3:  # the paired t test needs 3 pairs: below that no look can decide anything
        raise ConfigError("--seeds", "seeds", f"auto:CAP needs a cap of at least 3 seeds (the paired test's "
                          f"minimum), got {text!r}")
    return n, sequential


def _os_error(e: OSError) -> str:
    return f"{e.filename}: {e.strerror}" if e.filename and e.strerror else str(e)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grpo_bench", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run an ablation grid x seeds, then write results and report")
    r.add_argument("ablation", help="ablation YAML, e.g. ablations/loss_modes.yaml")
    r.add_argument("--out", help="output directory (default results/<ablation name>)")
    r.add_argument("--seeds", metavar="N|auto[:CAP]",
                   help="use seeds 0..N-1 instead of the file's seeds; auto[:CAP]: seeds 0, 1, ... in batches of 5, "
                        "each followed by a group-sequential test of every ordering the ablation asks, until all are "
                        f"decided (an ordering either way, or equivalent within the margin) or CAP seeds ran "
                        f"(default {AUTO_CAP}); see docs/statistics.md")
    r.add_argument("--include", action="append", default=[], metavar="PATH",
                   help="a .py file or a directory of them with your own @register'ed parts or tasks "
                        "(added to the ablation's `include:`)")
    r.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a run config key for every variant, e.g. --set epochs=20 --set task.n=6")
    r.add_argument("--executor", choices=["local", "ray"],
                   help="local: a process pool on this machine (default); ray: one Ray task per run, here or on a cluster")
    r.add_argument("--address", help="Ray cluster to join (host:6379, or auto); default RAY_ADDRESS, "
                   "else a local Ray instance sized to this machine; implies --executor ray")
    r.add_argument("--max-retries", type=int, default=3,
                   help="Ray: times a run is resubmitted after its worker process or node died (default 3); "
                   "a run that raises is never retried")
    r.add_argument("--workers", type=int, help="local: parallel worker processes (default: one per CPU core; 1 = in-process)")
    r.add_argument("--threads", type=int, help="torch threads per run (default: the ablation's resources.cpus, 1)")
    r.add_argument("--population", type=int, metavar="N",
                   help="train up to N compatible runs (same task, shapes and parts; seeds and numbers may differ) "
                        "together in one process, stacked on a leading axis; a run's numbers do not depend on it. "
                        "Default: as many as fit in 2 GiB by the task's estimate of a run's memory, at most 64; "
                        "1 = one run per process")
    r.add_argument("--setting", action="append", metavar="NAME",
                   help="with a file that has `settings` (the same variants on several tasks): run only these "
                        "(repeatable; default all, each into results/<name>_<setting>)")
    r.add_argument("--log-to", action="append", default=[], metavar="TRACKER",
                   help="also log each finished run (config, every metric at its step, final values) to an "
                        "experiment tracker: tensorboard, wandb, mlflow or trackio (repeatable); offline, under "
                        "the output directory, unless the tracker's own environment says otherwise "
                        "(WANDB_MODE, MLFLOW_TRACKING_URI, TRACKIO_DIR); each is an extra: pip install -e '.[wandb]'")
    r.add_argument("--force", action="store_true",
                   help="run even when the output directory holds another ablation's results or runs this plan "
                        "does not have (its summary and report are replaced; runs/ keeps the runs)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    pl = sub.add_parser("plot", help="redraw figures and REPORT.md of a results directory from its files")
    pl.add_argument("dir")
    pl.add_argument("--format", default="png", help="figure file format: png, pdf or svg (default png)")
    pl.add_argument("--force", action="store_true",
                    help="rewrite REPORT.md even when these files hold fewer finished runs than it reports")
    c = sub.add_parser("compare", help="several results directories side by side: one figure, one table, "
                       "Kendall tau between their variant orderings")
    c.add_argument("dirs", nargs="+", metavar="DIR")
    c.add_argument("--metric", action="append", default=[], metavar="M",
                   help="summary metric, e.g. final/reward or eval/accuracy: once for all directories or once per "
                        "directory (default: each task's main metric)")
    c.add_argument("--out", help="output directory (default: compare_<A>_vs_<B> beside the first directory)")
    c.add_argument("--format", default="png", help="figure file format: png, pdf or svg (default png)")
    f = sub.add_parser("findings", help="write ROOT/FINDINGS.md: each published claim tested by an ablation with a "
                       "`claim`, on the toy and the LM, with effect sizes, Holm-corrected p and Kendall tau")
    f.add_argument("root", nargs="?", default="results")
    f.add_argument("--out", help="output file (default ROOT/FINDINGS.md)")
    g = sub.add_parser("gallery", help="write ROOT/README.md: every ablation's question, headline figure and answer")
    g.add_argument("root", nargs="?", default="results")
    ls = sub.add_parser("list", help="print every registered part with its parameters, and the task presets")
    ls.add_argument("--include", action="append", default=[], metavar="PATH",
                    help="also load these .py files or directories of your own parts")
    bs = sub.add_parser("build-start", help="build a preset's shipped start: a fresh tiny GPT-2 trained by supervised "
                        "steps on the generator's reference answers until held-out greedy accuracy and pass@k meet "
                        "the preset's `start:` criterion; writes <dir>/checkpoint/ and <dir>/manifest.json",
                        description="Build the start model a preset names (task.model.source: shipped:<dir>) as its "
                        "`start:` section says (grpo_bench/tasks/lm/build_start.py), on one CPU thread, into <dir>/ beside "
                        "the preset: the checkpoint and manifest.json (file hashes, held-out split, accuracies, "
                        "this command, machine). Commit them together.")
    bs.add_argument("preset", help="the preset YAML, e.g. tasks/countdown.yaml")
    bs.add_argument("--out", help="write <OUT>/<dir>/ instead of beside the preset")
    bs.add_argument("--seed", type=int, help="the same recipe from another seed (its weights' init and its data "
                    "order), into <dir>_seed<SEED>/: an independent start, to measure how much a result owes to it")
    args = p.parse_args(argv)
    if args.cmd != "run":
        try:
            return _command(args)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        except OSError as e:
            print(f"error: {_os_error(e)}", file=sys.stderr)
            return 1
    if threading.current_thread() is not threading.main_thread():
        return _run(args)
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return _run(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _command(args) -> int:
    """Every command but `run`; raises ConfigError or OSError for main to print."""
    if args.cmd == "list":
        from .config import presets
        from . import registry
        from .config.run import load_includes
        load_includes([str(Path(p).resolve()) for p in args.include], "--include")
        from .numerics.kernels.spec import fused_names
        print(registry.describe(fused_names))
        print(f"presets ({registry.tasks_dir()}):")
        for name in presets.names():
            first = presets.description(name).split(". ")[0].rstrip(".")
            print(f"  {name:<24} [{presets.section(name)['name']}] {first}.")
        return 0
    if args.cmd == "plot":
        from .analysis.plotting import FORMATS
        from .analysis.report import make_report
        from .store.rundir import finished_in_report, load, metrics_path
        d = Path(args.dir)
        for f in ["ablation.json", "summary.csv"]:
            if not (d / f).is_file():
                raise ConfigError(str(d), "<dir>", f"not a results directory: no {f} "
                                  "(needs ablation.json, summary.csv, metrics.parquet)")
        if metrics_path(d) is None:
            raise ConfigError(str(d), "<dir>", "not a results directory: no metrics.parquet")
        if args.format not in FORMATS:
            raise ConfigError("plot", "--format", f"unknown {args.format!r}; valid: {', '.join(FORMATS)}")
        summary = load(d)[1]
        had, now = finished_in_report(d / "REPORT.md"), int((summary.status == "ok").sum())
        if had is not None and now < had and not args.force:
            raise ConfigError(str(d / "REPORT.md"), "runs", f"it reports {had} finished runs, summary.csv only "
                              f"{now}; not overwritten (check summary.csv, or plot --force to redraw with fewer)")
        print(make_report(d, fmt=args.format))
        return 0
    if args.cmd == "compare":
        from .analysis.compare import compare
        path, text = compare(args.dirs, args.metric or None, args.out, args.format)
        print(text + f"\nwritten: {path}")
        return 0
    if args.cmd == "findings":
        from .analysis.findings_text import RULES_FILE, write_findings
        if (Path(args.root) / RULES_FILE).is_file():
            # judged again on the results as they are now, before FINDINGS appends it: appended as committed, it
            # went stale when fp32_head's SmolLM2 runs came in (one cell and five counts short)
            from .analysis import rule_changes
            rule_changes.main([args.root])
        print(write_findings(Path(args.root), Path(args.out) if args.out else None))
        return 0
    if args.cmd == "build-start":
        from .tasks.lm.build_start import build
        try:
            argv = [args.preset] + (["--out", args.out] if args.out else []) + (
                ["--seed", str(args.seed)] if args.seed is not None else [])
            build(Path(args.preset), Path(args.out) if args.out else None, argv=argv, seed=args.seed)
        except ValueError as e:
            if isinstance(e, ConfigError):
                raise
            raise ConfigError(args.preset, "start", str(e).removeprefix("start: ")) from None
        return 0
    if args.cmd == "gallery":
        from .analysis.compare import gallery
        print(gallery(args.root))
        return 0


def _run(args) -> int:
    import os
    from .numerics import cpu
    os.environ["GRPO_BENCH_CPU_PIN"] = "1"  # its spawned workers pin too (sweep/worker.py)
    cpu.pin()  # a run in this process (--workers 1) must compute nothing before it
    try:
        n_seeds, sequential = parse_seeds(args.seeds)
        if args.workers is not None and args.workers < 1:
            raise ConfigError("--workers", "workers", f"must be >= 1, got {args.workers}")
        if args.population is not None and args.population < 1:
            raise ConfigError("--population", "population", f"must be >= 1, got {args.population}")
        if args.threads is not None and args.threads < 1:
            raise ConfigError("--threads", "threads", f"must be >= 1, got {args.threads}")
        if args.max_retries < 0:
            raise ConfigError("--max-retries", "max_retries", f"must be >= 0, got {args.max_retries}")
        from .sweep.trackers import check_installed
        check_installed(args.log_to)
        if args.address and args.executor == "local":
            raise ConfigError("--address", args.address, "is for --executor ray")
        args.executor = args.executor or ("ray" if args.address else "local")
        if args.executor == "ray" and args.workers is not None:
            raise ConfigError("--workers", "workers", "is for --executor local; on Ray the ablation's "
                              "resources (--set resources.cpus=N) decide how many runs share a node")
        # a file with `settings` runs the same variants on each task it names, one results directory each
        settings = args.setting or ablation_settings(args.ablation) or [None]
        ablations = [load_ablation(args.ablation, seeds=n_seeds, sets=args.sets, setting=s, include=args.include)
                     for s in settings]
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    from .analysis.report import make_report
    from .store.rundir import finished_in_report
    from .sweep.worker import WorkerLost
    from .sweep.runner import run_ablation

    any_failed = False
    for abl in ablations:
        if args.out:
            out = Path(args.out) / abl.name if len(ablations) > 1 else Path(args.out)
        else:
            out = Path("results") / abl.name
        kept = f"finished runs are kept in {out / 'runs'}; run the same command again to resume"
        try:
            summary = run_ablation(abl, out, executor=args.executor, workers=args.workers, threads=args.threads,
                                   address=args.address, max_retries=args.max_retries, progress=not args.no_progress,
                                   population=args.population, log_to=tuple(args.log_to),
                                   sequential=sequential, force=args.force)
            had = finished_in_report(out / "REPORT.md")
            report = make_report(out)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        except WorkerLost as e:
            print(f"error: {e}; {kept}", file=sys.stderr)
            return 1
        except OSError as e:  # a full disk or a read-only directory: what was written whole stays
            print(f"error: cannot write {_os_error(e)}; {kept}", file=sys.stderr)
            return 1
        except KeyboardInterrupt as e:
            if isinstance(e, Terminated):
                print(f"terminated: {kept}", file=sys.stderr)
                return 143
            print(f"interrupted: {kept}", file=sys.stderr)
            return 130
        failed = int((summary.status != "ok").sum()) if len(summary) else 0
        ok = len(summary) - failed
        if had is not None and ok < had:  # a smaller plan than the report it replaces: say so
            print(f"note: {report} now has {ok} finished runs (it had {had}): this plan has fewer runs than "
                  "the one reported before", file=sys.stderr)
        print(f"{abl.name}: {ok} runs ok, {failed} failed; report: {report}")
        if failed:
            print(f"error: {failed} of {len(summary)} runs failed; their errors are in {report}", file=sys.stderr)
            any_failed = True
    return 1 if any_failed else 0


if __name__ == "__main__":
    sys.exit(main())
