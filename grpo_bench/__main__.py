"""Command line: `python -m grpo_bench {run,plot,compare,gallery,list}`.

Bad input (unknown part, key, type or value) ends with exit code 2 and one line
naming the file, the key and the valid choices, never a traceback.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .config import ConfigError, load_ablation


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grpo_bench", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run an ablation grid x seeds, then write results and report")
    r.add_argument("ablation", help="ablation YAML, e.g. ablations/loss_modes.yaml")
    r.add_argument("--out", help="output directory (default results/<ablation name>)")
    r.add_argument("--seeds", type=int, help="use seeds 0..N-1 instead of the file's seeds")
    r.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a run config key for every variant, e.g. --set epochs=20 --set task.n=6")
    r.add_argument("--workers", type=int, help="parallel worker processes (default: one per CPU core; 1 = in-process)")
    r.add_argument("--threads", type=int, default=1, help="torch threads per worker (default 1)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    pl = sub.add_parser("plot", help="redraw figures and REPORT.md of a results directory from its files")
    pl.add_argument("dir")
    pl.add_argument("--format", default="png", help="figure file format: png, pdf or svg (default png)")
    c = sub.add_parser("compare", help="several results directories side by side: one figure, one table, "
                       "Kendall tau between their variant orderings")
    c.add_argument("dirs", nargs="+", metavar="DIR")
    c.add_argument("--metric", action="append", default=[], metavar="M",
                   help="summary metric, e.g. final/reward or eval/accuracy: once for all directories or once per "
                        "directory (default: each task's main metric)")
    c.add_argument("--out", help="output directory (default: compare_<A>_vs_<B> beside the first directory)")
    c.add_argument("--format", default="png", help="figure file format: png, pdf or svg (default png)")
    g = sub.add_parser("gallery", help="write ROOT/README.md: every ablation's question, headline figure and answer")
    g.add_argument("root", nargs="?", default="results")
    sub.add_parser("list", help="print every registered part with its parameters")
    args = p.parse_args(argv)

    try:
        if args.cmd == "list":
            from . import registry
            print(registry.describe())
            return 0
        if args.cmd == "plot":
            from .report import FORMATS, make_report
            d = Path(args.dir)
            for f in ["ablation.json", "summary.csv", "metrics.csv"]:
                if not (d / f).is_file():
                    raise ConfigError(str(d), "<dir>", f"not a results directory: no {f} "
                                      "(needs ablation.json, summary.csv, metrics.csv)")
            if args.format not in FORMATS:
                raise ConfigError("plot", "--format", f"unknown {args.format!r}; valid: {', '.join(FORMATS)}")
            print(make_report(d, fmt=args.format))
            return 0
        if args.cmd == "compare":
            from .compare import compare
            path, text = compare(args.dirs, args.metric or None, args.out, args.format)
            print(text + f"\nwritten: {path}")
            return 0
        if args.cmd == "gallery":
            from .compare import gallery
            print(gallery(args.root))
            return 0
        if args.seeds is not None and args.seeds < 1:
            raise ConfigError("--seeds", "seeds", f"must be >= 1, got {args.seeds}")
        if args.workers is not None and args.workers < 1:
            raise ConfigError("--workers", "workers", f"must be >= 1, got {args.workers}")
        abl = load_ablation(args.ablation, seeds=args.seeds, sets=args.sets)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    from .report import make_report
    from .runner import run_ablation

    out = Path(args.out) if args.out else Path("results") / abl.name
    try:
        summary = run_ablation(abl, out, workers=args.workers, threads=args.threads, progress=not args.no_progress)
    except KeyboardInterrupt:
        print(f"interrupted: finished runs are kept in {out}/runs; run the same command again to resume", file=sys.stderr)
        return 130
    report = make_report(out)
    failed = int((summary.status != "ok").sum()) if len(summary) else 0
    print(f"{len(summary) - failed} runs ok, {failed} failed; report: {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
