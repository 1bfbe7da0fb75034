"""Experiment trackers: `run --log-to tensorboard|wandb|mlflow|trackio` (repeatable).

Each finished run becomes one tracked run named by its run id, grouped by its variant,
holding its resolved config, every metric at its step and its summary (status,
final/* values, wall time). The driver logs a run right after it writes the run's
directory, so every executor (the local pool, Ray) logs the same way; a run skipped
on resume was logged by the sweep that finished it.

Offline by default, everything under the output directory OUT:

    tensorboard   OUT/tensorboard/<run>/   tensorboard --logdir OUT/tensorboard
    wandb         OUT/wandb/offline-run-*  wandb sync OUT/wandb/offline-run-*  (WANDB_MODE=online: live)
    mlflow        OUT/mlflow.db (SQLite)   mlflow ui --backend-store-uri sqlite:///OUT/mlflow.db
                                           (MLFLOW_TRACKING_URI set: that server or store instead)
    trackio       OUT/trackio/<name>.db    TRACKIO_DIR=OUT/trackio trackio show  (TRACKIO_DIR set: that store)

MLflow's file store (./mlruns) is refused by MLflow 3 unless opted into, so its local
store here is the SQLite one MLflow now recommends. A tracker that fails on a run, or has not
finished logging it after TIMEOUT_S seconds (GRPO_BENCH_TRACKER_TIMEOUT; an unreachable MLflow
server retries for ~4 minutes, W&B's init waits 90 s), prints one line and is switched off for
the rest of the sweep, which goes on: the runs' own files are already written.
"""
from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from tqdm import tqdm

from ..errors import ConfigError


def check_installed(names) -> None:
    """ConfigError naming the extra for the first tracker that is not installed (nothing imported).

    Each tracker's module, and the pyproject extra that installs it, has the tracker's name."""
    for name in names:
        if name not in BACKENDS:
            raise ConfigError("--log-to", name, f"unknown tracker; valid: {', '.join(BACKENDS)}")
        if importlib.util.find_spec(name) is None:
            raise ConfigError("--log-to", name, f"{name} is not installed; install it with "
                              f"pip install -e '.[{name}]'")


def _steps(rows) -> list[tuple[int, dict]]:
    """(step, {metric: value}) in step order: wandb and trackio want steps that only grow."""
    by: dict[int, dict] = {}
    for step, metric, value in rows:
        by.setdefault(int(step), {})[metric] = float(value)
    return sorted(by.items())


def _flat(cfg: dict, prefix: str = "") -> dict:
    """Nested config as dotted keys with scalar values (lists as JSON): what HParams and MLflow params take."""
    out = {}
    for k, v in cfg.items():
        if isinstance(v, dict):
            out |= _flat(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v if isinstance(v, (str, int, float, bool, type(None))) else json.dumps(v)
    return out


def _finals(summary: dict) -> dict:
    return {k: float(v) for k, v in summary.items() if k.startswith("final/") or k == "wall_s"}


class TensorBoard:
    def __init__(self, out: Path, project: str):
        self.root = out / "tensorboard"

    def log(self, run: str, variant: str, cfg: dict, rows: list, summary: dict) -> None:
        import yaml
        from torch.utils.tensorboard import SummaryWriter

        w = SummaryWriter(log_dir=str(self.root / run))
        try:
            steps = _steps(rows)
            for step, metrics in steps:
                for k, v in metrics.items():
                    w.add_scalar(k, v, step)
            w.add_text("config", "```yaml\n" + yaml.safe_dump(cfg, sort_keys=False) + "```")
            # the HParams tab: one row per run, its config beside its final values
            hp = {k: v for k, v in _flat(cfg).items() if v is not None} | {"variant": variant, "status": summary["status"]}
            w.add_hparams(hp, _finals(summary), run_name=".", global_step=steps[-1][0] if steps else 0)
        finally:
            w.close()

    def where(self) -> str:
        return f"tensorboard --logdir {self.root}"


class WandB:
    def __init__(self, out: Path, project: str):
        self.out, self.project = out, project
        # offline unless the user asked wandb itself for more (WANDB_MODE=online)
        self.mode = os.environ.get("WANDB_MODE") or "offline"

    def log(self, run: str, variant: str, cfg: dict, rows: list, summary: dict) -> None:
        import wandb

        # the driver's console, git state and machine are not the run's: keep them out
        settings = wandb.Settings(silent=True, console="off", x_disable_stats=True, disable_git=True,
                                  save_code=False, x_save_requirements=False, disable_job_creation=True)
        r = wandb.init(mode=self.mode, dir=str(self.out), project=self.project, name=run, group=variant,
                       config=cfg, settings=settings)
        try:
            for step, metrics in _steps(rows):
                r.log(metrics, step=step)
            r.summary.update({k: summary[k] for k in ("status", "error") if k in summary} | _finals(summary))
        finally:
            r.finish(exit_code=0 if summary["status"] == "ok" else 1)

    def where(self) -> str:
        if self.mode == "offline":
            return f"wandb sync {self.out}/wandb/offline-run-*"
        return f"wandb (mode {self.mode})"


class MLflow:
    BATCH = 1000  # MLflow's limit of metrics per log_batch (and 100 params)

    def __init__(self, out: Path, project: str):
        self.uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{out.resolve()}/mlflow.db"
        self.out, self.project, self.client, self.exp = out, project, None, None

    @staticmethod
    def name(metric: str) -> str:
        # MLflow takes letters, digits and _ - . space : / only (eval/pass@k -> eval/pass_k)
        return re.sub(r"[^\w\-. :/]", "_", metric)

    def log(self, run: str, variant: str, cfg: dict, rows: list, summary: dict) -> None:
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        if self.client is None:
            # a new store announces its table creation at INFO, inside the progress bar
            logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
            self.client = MlflowClient(tracking_uri=self.uri)
            exp = self.client.get_experiment_by_name(self.project)
            # an explicit artifact root: the default is relative to wherever the driver was started
            self.exp = exp.experiment_id if exp else self.client.create_experiment(
                self.project, artifact_location=(self.out / "mlartifacts").resolve().as_uri())
        ok = summary["status"] == "ok"
        r = self.client.create_run(self.exp, run_name=run, tags={"variant": variant, "status": summary["status"],
                                                                  "error": summary.get("error", "")})
        rid = r.info.run_id
        ms = int(time.time() * 1000)
        steps = _steps(rows)
        last = steps[-1][0] if steps else 0
        metrics = [Metric(self.name(k), v, ms, step) for step, m in steps for k, v in m.items()]
        metrics += [Metric(self.name(k), v, ms, last) for k, v in _finals(summary).items()]
        params = [Param(k, str(v)) for k, v in _flat(cfg).items()]
        try:
            for i in range(0, len(params), 100):
                self.client.log_batch(rid, params=params[i:i + 100])
            for i in range(0, len(metrics), self.BATCH):
                self.client.log_batch(rid, metrics=metrics[i:i + self.BATCH])
        finally:
            self.client.set_terminated(rid, "FINISHED" if ok else "FAILED")

    def where(self) -> str:
        return f"mlflow ui --backend-store-uri {self.uri}"


class Trackio:
    """trackio fixes its store's place (TRACKIO_DIR) when first imported, so this driver, which may run
    several ablations into several directories, logs through one child process per ablation."""

    def __init__(self, out: Path, project: str):
        self.store = os.environ.get("TRACKIO_DIR") or str(out / "trackio")
        self.project, self.child = project, None

    def log(self, run: str, variant: str, cfg: dict, rows: list, summary: dict) -> None:
        if self.child is None:
            self.child = subprocess.Popen([sys.executable, "-m", "grpo_bench.sweep.trackers", "trackio", self.project],
                                          stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                                          env=dict(os.environ, TRACKIO_DIR=self.store))
        steps = _steps(rows) or [(0, {})]
        steps[-1][1].update(_finals(summary))  # trackio has no summary: final values at the last step
        try:
            self.child.stdin.write(json.dumps({"name": run, "group": variant, "config": cfg, "steps": steps}) + "\n")
            self.child.stdin.flush()
        except BrokenPipeError:
            raise RuntimeError(f"the trackio process ended (exit code {self.child.wait()})") from None

    def close(self) -> None:
        if self.child is not None:
            try:
                self.child.stdin.close()
            except BrokenPipeError:
                pass
            if self.child.wait() != 0:
                raise RuntimeError(f"the trackio process ended with exit code {self.child.returncode}")

    def where(self) -> str:
        return f"TRACKIO_DIR={self.store} trackio show --project {self.project}"


def _trackio_child(project: str) -> None:
    """One line of JSON per run on stdin; runs in a process whose TRACKIO_DIR is the store."""
    import signal

    import trackio

    # Ctrl-C reaches this whole process group: finish the runs already sent, end when stdin closes
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    for line in sys.stdin:
        r = json.loads(line)
        trackio.init(project=project, name=r["name"], group=r["group"], config=r["config"],
                     auto_log_cpu=False, auto_log_gpu=False, embed=False)
        for step, metrics in r["steps"]:
            trackio.log(metrics, step=step)
        trackio.finish()


BACKENDS = {"tensorboard": TensorBoard, "wandb": WandB, "mlflow": MLflow, "trackio": Trackio}


TIMEOUT_S = 120.0  # one run's logging, per tracker; GRPO_BENCH_TRACKER_TIMEOUT overrides


def timeout_s() -> float:
    text = os.environ.get("GRPO_BENCH_TRACKER_TIMEOUT")
    try:
        return TIMEOUT_S if text is None else float(text)
    except ValueError:
        raise ConfigError("GRPO_BENCH_TRACKER_TIMEOUT", text, "expected seconds") from None


def _bounded(fn, seconds: float):
    """fn() in a daemon thread; its exception raised here, TimeoutError if it has not returned after `seconds`
    (the thread is left to finish or to die with the process: a tracker's network wait cannot be cut)."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:
            box["error"] = e

    t = threading.Thread(target=target, daemon=True, name="grpo_bench-tracker")
    t.start()
    t.join(seconds if seconds > 0 else None)
    if t.is_alive():
        raise TimeoutError(f"no answer within {seconds:g} s (GRPO_BENCH_TRACKER_TIMEOUT sets the limit)")
    if "error" in box:
        raise box["error"]
    return box.get("value")


class Trackers:
    """The trackers one ablation logs to; `log(result)` after each run directory is written. A tracker that
    fails or times out on a run is switched off for the rest of the sweep (`off`: its name -> that run)."""

    def __init__(self, names, out: Path, project: str):
        self.backends = {n: BACKENDS[n](Path(out), project) for n in dict.fromkeys(names)}
        self.logged = dict.fromkeys(self.backends, 0)
        self.off: dict[str, str] = {}
        self.timeout = timeout_s()

    def log(self, result) -> None:
        cfg, rows, summary = result[:3]
        for name, b in self.backends.items():
            if name in self.off:
                continue
            try:
                _bounded(lambda: b.log(summary["run"], summary["variant"], cfg, rows, summary), self.timeout)
                self.logged[name] += 1
            except Exception as e:  # the run's files are written; a tracker's failure must not end the sweep
                self.off[name] = summary["run"]
                tqdm.write(f"warning: --log-to {name}: run {summary['run']} not logged: "
                           f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}; {name} is off for "
                           "the rest of this sweep", file=sys.stderr)

    def close(self) -> None:
        for name, b in self.backends.items():
            try:
                if hasattr(b, "close"):
                    _bounded(b.close, self.timeout)
                if self.logged[name]:
                    print(f"{name}: {self.logged[name]} runs logged; view: {b.where()}", file=sys.stderr)
                if name in self.off:
                    print(f"{name}: off since run {self.off[name]}: the runs after it are in runs/ only",
                          file=sys.stderr)
            except Exception as e:
                print(f"warning: --log-to {name}: {type(e).__name__}: {e}", file=sys.stderr)


if __name__ == "__main__":
    if sys.argv[1:2] == ["trackio"]:
        _trackio_child(sys.argv[2])
