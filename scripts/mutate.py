"""Mutation testing on demand: small AST mutants of a module, one at a time, each run
against the tests that execute the mutated line. A mutant no test notices is a bug the
suite would let through.

    .venv/bin/python scripts/mutate.py                         # every module below -> results/mutation.md
    .venv/bin/python scripts/mutate.py grpo_bench/engine/trainer.py   # one module (prints, writes nothing)
    .venv/bin/python scripts/mutate.py grpo_bench/engine/trainer.py --show   # and each survivor's diff
    .venv/bin/python scripts/mutate.py --jobs 1                # default 2: one per core

Mutants (curated, one change each): arithmetic and bitwise operator swaps (+ -, * /, ** *,
// /, | &, augmented too), comparison swaps (< <=, > >=, == !=, is / is not, in / not in),
and / or, dropped `not` / unary minus (except on -1) / `~`, numbers n -> n + 1, True <-> False,
min <-> max, minimum <-> maximum, sum <-> mean, any <-> all, argmax <-> argmin, dropped
.detach() / .clone(), a bare `if x:` negated, and removed statements (a call for its
effect, an augmented or attribute/item assignment, break, continue). Strings, docstrings,
annotations, a figure's looks (matplotlib size, width and spacing keywords, plotting.py's
style tables) and a progress bar's drawing (tqdm's dynamic_ncols, refresh) are left alone.

How: the repository (git ls-files) is copied once per job. A first run of the module's
tests in the copy traces which test executes which line of the module, and how long each
test takes. Then, per mutant: the mutated module is written into the copy, and a child
forked from this process (torch, pandas and matplotlib already imported: no interpreter
start per mutant) runs pytest on the tests that execute the mutated statement, fastest
first, stopping at the first failure. Killed: a test failed or it ran past 3x the tests'
baseline time + 20 s. Survived: every covering test passed. No test: no test of the
module's subset executes the statement (a survivor that needs no run). A mutant in a
module-level statement, a default value or a decorator runs every test of the subset. Equivalent: listed
in scripts/mutants_equivalent.tsv with the reason the change cannot alter behaviour.

A test that fails under the tracer (threading.settrace: a reward's thread stopped by an async exception, a
caller's interval timer) is left out of the traced run with -k and listed in UNTRACED: it runs untraced in
the baseline, then after the covering tests for every mutant of its module.

grpo_bench/algos (the registered parts, every variant a verdict compares) and grpo_bench/store are mutated
here like any module: a decorated function is an AST function like another (mutmut 3.8.1 skips them; cosmic-ray
8.7, used for these two wings until 2026-12-01, runs each mutant's whole test command in a fresh interpreter,
which on this 2-core machine afforded samples only).
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENT = ROOT / "scripts" / "mutants_equivalent.tsv"
REPORT = ROOT / "results" / "mutation.md"

# test_faults.py's tests that run pytest itself in a child: it inherits the child's PYTEST_DISABLE_PLUGIN_AUTOLOAD
# (no xdist for pyproject's -n), and no line of a module is traced there
FAULTS_PYTEST = "(the_suite_collects or tests_that_use_an_extra)"
# module -> the fast tests that cover it (pytest arguments)
MODULES = {
    # test_population.py: a member's failure and the population's narrowing; test_parts_v3.py: entropy control,
    # dynamic sampling's redraws (without them 57 of trainer.py's and 10 of sampling.py's mutants had no test)
    # test_arithmetic's rank-cut test: the one trainer line that reads a task's ref/mix_residual
    "grpo_bench/engine/trainer.py": ["tests/test_trainer.py", "tests/test_population.py", "tests/test_parts_v3.py",
                                     "tests/test_sampler.py", "tests/test_outcomes.py",
                                     "tests/test_arithmetic.py::test_a_soft_reference_logs_each_runs_rank_cut"],
    "grpo_bench/engine/sampling.py": ["tests/test_trainer.py", "tests/test_sampler.py", "tests/test_cpu_numerics.py",
                                      "tests/test_population.py", "tests/test_parts_v3.py"],
    # the composed loss's entropy, NLL and KL terms are the trainer's (test_parts_v3/v4); the logits -> loss
    # path and the sum_pi_squared statistic have their own files (without them 36 of 121 mutants had no test)
    "grpo_bench/numerics/logprobs.py": ["tests/test_logprobs.py", "tests/test_properties.py", "tests/test_kernels_loss.py",
                                        "tests/test_kernels_logits_loss.py", "tests/test_parts_v3.py",
                                        "tests/test_parts_v4.py", "tests/test_arithmetic_fused.py"],
    # the CLI-subprocess tests of test_runner.py execute runner.py in other processes, where no
    # line is traced: they could never be picked for a mutant, so the baseline skips them too
    # test_faults/test_storage/test_trackers/test_seeds_auto: a results directory refused, a damaged run redone,
    # the trackers, --seeds auto's batches
    "grpo_bench/sweep/runner.py": ["tests/test_runner.py", "tests/test_faults.py", "tests/test_storage.py",
                                   "tests/test_trackers.py", "tests/test_seeds_auto.py", "-k",
                                   "not shipped and not kill_and_resume and not failed_run_is_recorded "
                                   f"and not {FAULTS_PYTEST}"],
    # the sampler's, entropy's, NLL's and include's keys are validated and used in their own files
    "grpo_bench/config/run.py": ["tests/test_config.py", "tests/test_lm_rewards.py", "tests/test_findings.py",
                                "tests/test_faults.py", "tests/test_sampler.py", "tests/test_parts_v3.py",
                                "tests/test_parts_v4.py", "tests/test_include.py", "-k", f"not {FAULTS_PYTEST}"],
    "grpo_bench/analysis/plotting.py": ["tests/test_report.py"],
    "grpo_bench/analysis/figures.py": ["tests/test_report.py", "tests/test_mechanism.py"],
    "grpo_bench/analysis/report.py": ["tests/test_report.py"],
    # the verdict itself: an ordering's outcome from its pairs, the mechanism gate that withholds it, and
    # findings' judging of a results directory
    "grpo_bench/stats/verdicts.py": ["tests/test_stats.py", "tests/test_findings.py", "tests/test_mechanism.py"],
    "grpo_bench/stats/paired.py": ["tests/test_stats.py", "tests/test_findings.py"],
    "grpo_bench/analysis/mechanism.py": ["tests/test_mechanism.py", "tests/test_findings.py"],
    "grpo_bench/analysis/findings.py": ["tests/test_findings.py", "tests/test_mechanism.py", "tests/test_stats.py"],
    # the seeds x problems test behind every LM row, and the seeds a verdict would need (undecided rows);
    # docs/statistics.md's worked numbers are held by test_doc_numbers_statistics
    "grpo_bench/stats/crossed.py": ["tests/test_stats.py", "tests/test_findings.py", "tests/test_doc_numbers_statistics.py"],
    "grpo_bench/stats/power.py": ["tests/test_stats.py", "tests/test_findings.py", "tests/test_doc_numbers_statistics.py"],
    # what every verdict is read from: the per-seed final/area, the common sample budget, the seeds x problems
    # table and the plateau; test_starts reads a start's headroom through it
    "grpo_bench/analysis/quantities.py": ["tests/test_quantities.py", "tests/test_findings.py", "tests/test_mechanism.py",
                                          "tests/test_starts.py", "tests/test_doc_numbers_statistics.py"],
    # FINDINGS.md's words and counts: outcomes per cell, "holds on k of m", Kendall's W, the notes' numbers
    "grpo_bench/analysis/findings_text.py": ["tests/test_findings.py", "tests/test_mechanism.py", "tests/test_starts.py",
                                             "tests/test_doc_numbers_notes.py"],
    # every run's update: the stacked optimizer and the per-member clip (test_population holds them to torch.optim
    # on each member alone, to the bit)
    "grpo_bench/engine/optim.py": ["tests/test_population.py", "tests/test_trainer.py", "tests/test_parts_v3.py",
                                   "tests/test_parts_v4.py"],
    # a run's parts composed: advantages, the loss, KL and its coefficient, entropy control, the reference's weight
    "grpo_bench/engine/recipe.py": ["tests/test_recipe.py", "tests/test_trainer.py", "tests/test_parts_v3.py",
                                    "tests/test_parts_v4.py", "tests/test_population.py", "tests/test_sampler.py",
                                    "tests/test_outcomes.py"],
    # the random streams: common random numbers across variants, a seed's draws the same in any population
    "grpo_bench/numerics/rng.py": ["tests/test_population.py", "tests/test_trainer.py", "tests/test_sampler.py",
                                   "tests/test_arithmetic.py", "tests/test_problems.py", "tests/test_outcomes.py"],
    # FINDINGS_rules.md, v3's rules replayed step by step to v4's: a planted root (test_rule_changes); the committed
    # page's own test (test_findings, about 45 s a run) is left out, so each mutant runs in seconds
    "grpo_bench/analysis/rule_changes.py": ["tests/test_rule_changes.py", "tests/test_mechanism.py",
                                            "tests/test_doc_numbers_statistics.py"],
    # `compare`: the same ablation in two results directories (two starts, two machines), its table, orderings
    # and the variance due to the start; test_report's compare tests draw its figure
    "grpo_bench/analysis/compare.py": ["tests/test_compare.py", "tests/test_starts.py", "tests/test_metrics.py",
                                       "tests/test_report.py", "tests/test_reliability.py", "-k",
                                       "compare or test_starts or test_metrics or kendall or gallery"],
}
# the registered parts, every variant a verdict compares: each against its paper's formula and hand values
# (test_algos, test_properties), TRL's own code (test_trl, test_trl_v3), and composed in a run (parts_v3/v4,
# recipe, sampler, vmap)
ALGOS_TESTS = ["tests/test_algos.py", "tests/test_properties.py", "tests/test_parts_v3.py", "tests/test_parts_v4.py",
               "tests/test_recipe.py", "tests/test_vmap.py", "tests/test_trl.py", "tests/test_trl_v3.py",
               "tests/test_sampler.py", "tests/test_lm_rewards.py"]
# and where a module is tested on its own: a user's part held to its axis's contract when it loads (test_include),
# a reward that never returns (test_reliability), the answer parser inside the problem generator (test_problems)
# the three tests of UNTRACED below, as a -k expression
_UNTRACED_K = "(called_from_a_thread or timer_running or trained_in_a_thread)"
_ALGOS_MORE = {"contracts": ["tests/test_include.py"],
               "rewards": ["tests/test_reliability.py", "-k", f"not test_reliability or (reward and not {_UNTRACED_K})"],
               "answers": ["tests/test_problems.py"]}
# a results directory, the one reader and writer of its files: written whole or not at all, a damaged run
# refused and redone (test_faults), the lock, collect's tables (test_storage, test_runner), outcomes and the
# task's record (test_outcomes, test_metrics), every refusal a one-line error (test_reliability)
MODULES["grpo_bench/store/rundir.py"] = [
    "tests/test_storage.py", "tests/test_faults.py", "tests/test_runner.py", "tests/test_outcomes.py",
    "tests/test_metrics.py", "tests/test_reliability.py", "-k",
    f"not shipped and not kill_and_resume and not failed_run_is_recorded and not {FAULTS_PYTEST} "
    f"and not {_UNTRACED_K}"]
# every metric declared once and what a task says about itself: the reports' labels, ranges, directions and
# margins (test_metrics: a task from nowhere else; test_stats/test_doc_numbers_statistics: the odds margin),
# the headroom a start is judged against (test_starts), the results' own record (test_storage)
MODULES["grpo_bench/store/metrics.py"] = [
    "tests/test_metrics.py", "tests/test_storage.py", "tests/test_stats.py", "tests/test_quantities.py",
    "tests/test_starts.py", "tests/test_doc_numbers_statistics.py", "tests/test_gym.py"]
# rliable's robust aggregates: REPORT's IQM and P(X > Y) intervals
MODULES["grpo_bench/stats/aggregates.py"] = ["tests/test_stats.py"]
# `--seeds auto:N`: O'Brien-Fleming-type boundaries (against gsDesign's table and simulated Brownian paths), the
# decision after each batch (test_seeds_auto: a sweep that stops), docs/statistics.md's boundaries and rates
MODULES["grpo_bench/stats/sequential.py"] = ["tests/test_stats.py", "tests/test_seeds_auto.py",
                                             "tests/test_doc_numbers_statistics.py"]
# an ablation file: its grid, variants, settings and claim, each refused in one line naming the file and key
# (test_config, test_reliability), claims and their orderings (test_findings: every shipped file on every setting;
# its whole-findings and shipped-run tests, 90 s and 50 s, are left out), mechanisms, includes, --seeds auto
MODULES["grpo_bench/config/ablation.py"] = [
    "tests/test_config.py", "tests/test_include.py", "tests/test_mechanism.py", "tests/test_findings.py",
    "tests/test_reliability.py", "tests/test_seeds_auto.py", "-k",
    "not committed_rule_changes and not readme_example and not shipped_claims_run and not committed_findings "
    f"and not {_UNTRACED_K}"]
# one registry per axis: how parts load, in a fresh registry (test_registry); a part's parameters from its signature and their bounds (test_algos), a user's parts from
# their own files, `module:function` and entry points (test_include; its README example, 28 s, left out), `list`
# (test_cli), the config's part specs (test_config), the population traits (test_vmap), the installed presets
MODULES["grpo_bench/registry.py"] = [
    "tests/test_registry.py", "tests/test_include.py", "tests/test_algos.py", "tests/test_config.py", "tests/test_cli.py", "tests/test_vmap.py",
    "tests/test_packaging.py", "-k", "not readme_example"]
# `--seeds auto:N` in the runner: batches, a look after each, the record kept through an interruption (test_seeds_auto),
# the sequential verdict findings reads from it
MODULES["grpo_bench/sweep/sequential.py"] = ["tests/test_seeds_auto.py", "tests/test_findings.py",
                                             "tests/test_reliability.py", "-k", "seeds or sequential or auto"]
# every user file read as YAML: a repeated key refused with its lines, 1e-3 a float, bad bytes and bad YAML named
MODULES["grpo_bench/config/strict_yaml.py"] = ["tests/test_faults.py", "tests/test_config.py", "tests/test_cli.py",
                                               "tests/test_reliability.py", "-k",
                                               f"not {FAULTS_PYTEST} and not {_UNTRACED_K}"]
# task presets in tasks/: a name, a section merged key by key under a file's overrides
MODULES["grpo_bench/config/presets.py"] = ["tests/test_config.py", "tests/test_cli.py", "tests/test_lm_rewards.py",
                                           "tests/test_gym.py"]
# what every task hands the trainer: a rollout taken and joined (dynamic sampling's redraws), a member's failure
# kept to itself (guarded), the device a run of each task takes
MODULES["grpo_bench/tasks/__init__.py"] = ["tests/test_trainer.py", "tests/test_population.py", "tests/test_parts_v3.py",
                                           "tests/test_sampler.py", "tests/test_gym.py", "tests/test_runner.py", "-k",
                                           "not shipped and not kill_and_resume and not failed_run_is_recorded"]
# what a worker process does around training: the pin before a user's includes, each run's result and failure
# with its innermost frames, progress on the pool worker's queue, the default population's memory budget
# (test_worker, in-process: the runner's tests reach the same code in workers the tracer cannot see)
MODULES["grpo_bench/sweep/worker.py"] = ["tests/test_worker.py", "tests/test_population.py", "tests/test_runner.py",
                                         "tests/test_reliability.py", "-k",
                                         "not shipped and not kill_and_resume and not failed_run_is_recorded "
                                         f"and not {_UNTRACED_K}"]
# ScaleRL's saturating curve against compute: the fit against scipy's least squares, its bootstrap CIs, what it
# declines to read (flat, on the search's edge, still rising, outside the metric's range), the half-budget check,
# REPORT's section and figure of it (test_report)
MODULES["grpo_bench/stats/fits.py"] = ["tests/test_stats.py", "tests/test_report.py::test_curves_against_compute_in_the_report",
                                       "tests/test_report.py::test_a_curve_is_fitted_from_min_points_on"]
# `run --log-to`: each tracker's round trip through its own reader (TensorBoard, W&B offline, MLflow's SQLite
# store, Trackio), one line for an unknown or failing tracker, each run logged once after its directory
MODULES["grpo_bench/sweep/trackers.py"] = ["tests/test_trackers.py"]
# arithmetic problems: the seeded stream, the held-out set and its commutative twins kept out of training, digit
# counts, templates and scratchpads, the answer read from a completion (test_lm_rewards: the rewards on top)
MODULES["grpo_bench/tasks/lm/problems.py"] = ["tests/test_problems.py", "tests/test_lm_rewards.py",
                                             "tests/test_arithmetic.py"]
# the sorting toy every toy verdict trains on: its policy (stacked members), rewards, sampling from the members'
# own streams, log-probs, the reference and its refresh, held-out greedy evaluation, member memory
# (test_runner: `device: auto`'s measured gpu_replaces_cores)
MODULES["grpo_bench/tasks/sort.py"] = [
    "tests/test_sort.py", "tests/test_trainer.py", "tests/test_population.py", "tests/test_parts_v3.py",
    "tests/test_recipe.py", "tests/test_runner.py::test_each_tasks_gpu_replaces_cores_is_the_measured_one"]
# the LM tasks' shared sections (model, adapter, warm-start, sampling) and their checks: every LM result's
# defaults (test_pretrained without the real weights' loads: a GGUF source's quantisation and checks)
MODULES["grpo_bench/tasks/lm/sections.py"] = [
    "tests/test_arithmetic.py", "tests/test_gym.py", "tests/test_config.py", "tests/test_pretrained.py", "-k",
    "not real_weights and not dequantised and not shipped_warm_up and not the_gpu_headroom"]
# the checkpoints shipped in tasks/<dir>/: names, manifests, their files' hashes (checked once a process), the
# held-out split a shipped start was warm-started around, the weights' part of a run id
# (test_config: the committed sweeps' run ids, which hold a shipped start's weights id)
MODULES["grpo_bench/tasks/lm/shipped.py"] = [
    "tests/test_shipped.py", "tests/test_faults.py", "tests/test_arithmetic.py", "tests/test_gym.py",
    "tests/test_config.py", "-k", f"not {FAULTS_PYTEST} and not sigterm and not sigkill"]
# the tiny model's character tokenizer: one token a character, BOS first, left padding, a vocabulary padded to a model's
MODULES["grpo_bench/tasks/lm/tokenizer.py"] = ["tests/test_arithmetic.py", "tests/test_problems.py",
                                              "tests/test_lm_rewards.py", "tests/test_build_start.py"]
# `build-start`: a start trained until its criterion, the manifest that holds it, a second phase the checked one,
# a criterion never met writing nothing, each bad key refused by name, a pretrained base's warm-up adapter;
# test_build_start_rules: when each builder checks and stops, on scripted scores without training
MODULES["grpo_bench/tasks/lm/build_start.py"] = ["tests/test_build_start.py", "tests/test_build_start_rules.py"]
# the supervised warm-start before GRPO: its schedule and steps by hand, the answer's end token per template,
# train/eval modes, the seed a check's samples draw from, one thread, the cache's names, lock and cleanup
MODULES["grpo_bench/tasks/lm/warmstart.py"] = ["tests/test_problems.py", "tests/test_arithmetic.py",
                                              "tests/test_build_start.py", "tests/test_gym.py"]
# the packaged GGUF source: its checks and install message, the run id's part, the file's hash, the weights'
# checksum and the machine's cache of them (built once under a lock, checked at each load, rebuilt when damaged);
# without the real weights' loads (test_pretrained: those take minutes a mutant)
MODULES["grpo_bench/tasks/lm/pretrained.py"] = [
    "tests/test_pretrained.py", "tests/test_config.py", "tests/test_gym.py", "-k",
    "not real_weights and not recorded_ones and not shipped_warm_up"]
# one frozen LM, one LoRA per population member: peft's initialisation and product, member-by-member GEMMs on a
# CPU, the reference's adapter and its mix, a narrowed population, the Gumbel-max sampler and its nucleus, the
# KV-cache generation loop (without the real weights' loads)
MODULES["grpo_bench/tasks/lm/stacked.py"] = [
    "tests/test_population.py", "tests/test_arithmetic.py", "tests/test_arithmetic_fused.py", "tests/test_pretrained.py",
    "tests/test_outcomes.py", "tests/test_vmap.py", "tests/test_sampler.py", "-k",
    "not real_weights and not recorded_ones and not shipped_warm_up"]
# reasoning-gym tasks on the arithmetic task's machinery: entries and their split, prompts from the metadata,
# the verifiers' scores and countdown's own checker, the presets' settings and checks
# (test_config: the committed sweeps' run ids, which hold every default)
MODULES["grpo_bench/tasks/gym.py"] = ["tests/test_gym.py", "tests/test_starts.py", "tests/test_config.py",
                                      "tests/test_build_start.py"]
# the LM task every arithmetic and gym verdict trains on: its config's refusals, a rollout's rewards, lengths and
# metrics, the held-out evaluation (greedy, pass@k, mean@k, the base model's accuracy and its reuse), the reference's
# samples, a narrowed population, the memory estimate (without the real weights' loads)
MODULES["grpo_bench/tasks/arithmetic.py"] = [
    "tests/test_arithmetic.py", "tests/test_arithmetic_fused.py", "tests/test_lm_rewards.py", "tests/test_problems.py",
    "tests/test_population.py", "tests/test_outcomes.py", "tests/test_sampler.py", "tests/test_gym.py",
    "tests/test_pretrained.py", "tests/test_runner.py::test_each_tasks_gpu_replaces_cores_is_the_measured_one", "-k",
    "not real_weights and not recorded_ones and not shipped_warm_up"]
# the LM's passes over a rollout: log-probs and entropy through the fused head (one head, member by member on a
# CPU, an adapter on the head) or the materialised logits, the shared prompt, sum pi^2, dropout streams
MODULES["grpo_bench/tasks/lm/passes.py"] = MODULES["grpo_bench/tasks/lm/stacked.py"]
# the committed figures' palette: its blends of the fixed colours, the adaptive fallback and its threshold, the bytes
MODULES["grpo_bench/analysis/png.py"] = ["tests/test_png.py"]
# loading an LM and its tokenizer (the tiny start, a local directory, a packaged GGUF), LoRA's targets and factors,
# the soft reference's rank cut, positions from left padding, the end-of-sequence ids, batch-invariant attention
MODULES["grpo_bench/tasks/lm/models.py"] = [
    "tests/test_arithmetic.py", "tests/test_population.py", "tests/test_pretrained.py", "tests/test_problems.py",
    "tests/test_arithmetic_fused.py", "tests/test_trl.py", "tests/test_gym.py",
    "tests/test_reliability.py::test_a_bad_local_model_is_refused_when_the_config_loads",
    "tests/test_reliability.py::test_a_good_local_model_and_hub_ids_pass_the_check",
    "tests/test_reliability.py::test_a_bad_local_model_is_refused_for_the_gym_task_too",
    "tests/test_reliability.py::test_safetensors_are_checked_to_the_byte", "-k",
    "not real_weights and not recorded_ones and not shipped_warm_up"]
# a figure's digest: what each artist, axes and the figure add, the rounding, limits only where set
MODULES["grpo_bench/analysis/figdata.py"] = ["tests/test_figdata.py"]
# the kernel benchmarks' table, figure and goal checks, from pytest-benchmark's JSON
MODULES["grpo_bench/analysis/bench_report.py"] = ["tests/test_bench_report.py"]
# the CPU pin: its decisions against a stand-in MKL here, the real one in a process per setting (UNTRACED below);
# the toy's and the LM's bit-for-bit runs under every library setting (10 minutes a mutant) are left to CI
_CPU_PROCESSES = ["tests/test_cpu_numerics.py::test_the_pin_overrides_what_the_environment_asked_for",
                  "tests/test_cpu_numerics.py::test_state_names_each_mkl_branch_as_mkl_numbers_it",
                  "tests/test_cpu_numerics.py::test_a_late_pin_warns_and_says_what_is_in_force",
                  "tests/test_cpu_numerics.py::test_a_worker_pins_before_a_users_part_is_probed"]
MODULES["grpo_bench/numerics/cpu.py"] = [
    "tests/test_cpu_numerics.py", "-k", "not toy_is_the_same and not short_lm_run and not cpu_memory and not docs_quote "
    "and not overrides_what and not names_each_mkl and not late_pin and not worker_pins"]
# the CPU's log-prob path (row chunks through one reused buffer, the backward recomputed per chunk): its
# values and gradients against fp64, its entropy, the fused head's use of its rows at a temperature, hypothesis'
# shapes and masks on the chunked backend
MODULES["grpo_bench/numerics/kernels/chunked.py"] = [
    "tests/test_logprobs.py", "tests/test_kernels_logprob.py", "tests/test_kernels_linear.py", "tests/test_properties.py",
    "-k", "not test_properties or chunked"]
# the Triton kernels, in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1 on a machine without a
# GPU, before any kernel module is imported): each against fp64, its gradient, its tiles and forced configurations
_KERNEL_TESTS = ["tests/test_kernels_logprob.py", "tests/test_kernels_loss.py", "tests/test_kernels_logits_loss.py",
                 "tests/test_kernels_linear.py", "tests/test_logprobs.py", "tests/test_arithmetic_fused.py"]
for _name in ("logprob", "loss", "logits_loss", "head", "linear"):
    MODULES[f"grpo_bench/numerics/kernels/{_name}.py"] = _KERNEL_TESTS
# the kernel's table of parts: the kernels against the torch parts, and `list` marking the fused ones
MODULES["grpo_bench/numerics/kernels/spec.py"] = _KERNEL_TESTS + [
    "tests/test_algos.py", "tests/test_parts_v3.py", "tests/test_parts_v4.py", "tests/test_vmap.py",
    "tests/test_registry.py"]
MODULES["grpo_bench/analysis/bench_population.py"] = ["tests/test_population_table.py"]
# the TRL integration: a variant resolved for GRPOConfig, and the trainer subclass against TRL's own (installed)
# (test_trl_multiprocess.py trains under accelerate in other processes, where no line is traced)
MODULES["grpo_bench/integrations/trl_variant.py"] = ["tests/test_trl.py", "tests/test_trl_v3.py"]
MODULES["grpo_bench/integrations/trl.py"] = MODULES["grpo_bench/integrations/trl_variant.py"] + [
    "tests/test_trl_internals.py"]
# the command line, through the tests that call main() in their own process (most CLI tests start `python -m
# grpo_bench`, a process the tracer cannot see): each subcommand's arguments, one-line errors and exit codes,
# --seeds, --set, signals; test_reliability's reward timeouts never reach it and fail under the tracer
MODULES["grpo_bench/__main__.py"] = [
    "tests/test_cli.py", "tests/test_seeds_auto.py", "tests/test_faults.py", "tests/test_reliability.py",
    "tests/test_report.py", "tests/test_rule_changes.py", "tests/test_storage.py", "tests/test_trackers.py",
    "tests/test_build_start.py", "tests/test_build_start_rules.py", "tests/test_metrics.py", "-k",
    f"not {FAULTS_PYTEST} and not {_UNTRACED_K}"]
# the Ray executor: Session's retries, failures and window against a stand-in ray module (test_reliability,
# test_cluster), the driver's use of a session (test_runner), one-line errors for a missing or unreachable
# cluster (test_cli), what a job ships (test_ray's one test without a cluster). test_ray's sweep on a real
# cluster runs its drivers in processes of their own, where no line is traced
MODULES["grpo_bench/sweep/cluster.py"] = [
    "tests/test_reliability.py", "tests/test_runner.py", "tests/test_cli.py", "tests/test_cluster.py",
    "tests/test_ray.py::test_job_ships_package_and_tasks_not_results", "-k",
    "ray or cluster or session or lost_with_its_worker"]
# CUDA graphs: StepGraph's warm-up, capture, replays, buffers and failed capture with torch.cuda stood in for
# (test_graphs), and the trainer's graphed step on the CPU (test_population)
MODULES["grpo_bench/engine/graphs.py"] = ["tests/test_graphs.py", "tests/test_population.py", "-k", "graph"]
# tests that fail under the tracer's threading.settrace (a reward's thread stopped by PyThreadState_SetAsyncExc,
# a caller's interval timer): run untraced in the baseline, then after a module's covering tests for every mutant
UNTRACED = {"grpo_bench/algos/rewards.py": [
    "tests/test_reliability.py::test_a_reward_that_never_returns_times_out_when_called_from_a_thread",
    "tests/test_reliability.py::test_a_reward_in_the_main_thread_with_a_timer_running_still_times_out",
    "tests/test_reliability.py::test_a_run_trained_in_a_thread_fails_alone_on_its_rewards_timeout"]}
# and tests whose code runs in a process of its own (the pin must come before a process computes): no line of
# theirs is traced, so the tracer could never pick them for a mutant
UNTRACED["grpo_bench/numerics/cpu.py"] = _CPU_PROCESSES
# two processes under torch.distributed.run against one (what gathers across processes: shares, statistics, rows)
UNTRACED["grpo_bench/integrations/trl.py"] = [f"tests/test_trl_multiprocess.py::{t}" for t in (
    "test_two_processes_ran_over_gloo", "test_same_global_batch_and_same_advantages",
    "test_every_logged_value_matches", "test_the_trained_weights_match")]
for _name in ["deltas", "losses", "kl", "corrections", "filters", "aggregate", "control", "rewards", "contracts",
              "answers", "common"]:
    MODULES[f"grpo_bench/algos/{_name}.py"] = ALGOS_TESTS + _ALGOS_MORE.get(_name, [])

SWAP_BINOP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.Pow: ast.Mult,
              ast.FloorDiv: ast.Div, ast.BitOr: ast.BitAnd, ast.BitAnd: ast.BitOr}
SWAP_CMP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
            ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
SWAP_NAME = {"min": "max", "max": "min", "minimum": "maximum", "maximum": "minimum", "sum": "mean",
             "mean": "sum", "any": "all", "all": "any", "argmax": "argmin", "argmin": "argmax"}
BUILTIN_SWAPS = ("min", "max", "any", "all")  # sum -> mean only as a method: there is no builtin mean
DROP_METHOD = ("detach", "clone")
# matplotlib keywords of looks (sizes, widths, transparency, spacing) and tqdm's of drawing (a bar
# following the terminal's width, redrawn now or at the next update): not mutated
STYLE_KWARGS = {"figsize", "dpi", "alpha", "lw", "linewidth", "s", "zorder", "handlelength", "columnspacing",
                "fontsize", "linscale", "numticks", "subs", "markersize", "ms", "dynamic_ncols", "refresh", "ls"}
STYLE_NAMES = {"RC", "PALETTE", "DASHES", "MARKERS", "COLUMN_IN", "PAGE_IN", "DPI"}  # plotting.py's style tables


@dataclass
class Mutant:
    module: str
    qualname: str
    desc: str          # what changed, e.g. "`<` -> `<=`"
    code: str          # the original line, stripped
    start: tuple       # (line, col) of the replaced segment
    end: tuple
    text: str          # its replacement
    anchor: tuple | None  # lines whose execution means a test reaches it; None: module level (every test)
    key: str = ""
    status: str = ""   # killed, timeout, survived, no test, equivalent
    reason: str = ""
    by: str = ""       # the test that killed it
    seconds: float = 0.0


# ------------------------------------------------------------------------ mutants


def _seg(src_lines: list[str], node) -> str:
    return ast.get_source_segment("".join(src_lines), node) or ""


class _Finder(ast.NodeVisitor):
    def __init__(self, module: str, source: str):
        self.module, self.source = module, source
        self.lines = source.splitlines(keepends=True)
        self.out: list[Mutant] = []
        self.scope: list[str] = []
        self.stmt: list[ast.stmt] = []
        self.func_body: list[tuple] = []   # (first, last) body lines of the enclosing functions
        self.in_header: list[bool] = []    # inside a def's signature or decorators

    # -- where a mutant is reached from
    def _anchor(self, node) -> tuple | None:
        if self.in_header and self.in_header[-1]:
            return None  # a default or a decorator: read at import (the registry's parameter table) and by callers
        if not self.func_body:
            return None
        st = self.stmt[-1]
        if isinstance(st, (ast.If, ast.For, ast.While, ast.With, ast.Try)):
            return (st.lineno, node.end_lineno)
        return (st.lineno, st.end_lineno)

    def _add(self, node, desc: str, text: str, wrap: bool = True) -> None:
        n_lines = node.end_lineno - node.lineno
        if wrap:  # parentheses keep precedence and allow the lines a multi-line node took
            text = "(" + text + "\n" * n_lines + ")"
        code = self.lines[node.lineno - 1].strip()
        self.out.append(Mutant(self.module, ".".join(self.scope) or "<module>", desc, code,
                               (node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset), text,
                               self._anchor(node)))

    # -- scopes
    def _scoped(self, node, name):
        self.scope.append(name)
        self.generic_visit(node)
        self.scope.pop()

    def visit_ClassDef(self, node):
        for d in node.decorator_list:
            self.visit(d)
        self.stmt.append(node)
        self.scope.append(node.name)
        for s in node.body:
            self.visit(s)
        self.scope.pop()
        self.stmt.pop()

    def visit_FunctionDef(self, node):
        body = node.body[1:] if _docstring(node) else node.body
        first = body[0].lineno if body else node.lineno
        self.func_body.append((first, node.end_lineno))
        self.stmt.append(node)
        self.in_header.append(True)
        self.scope.append(node.name)
        for d in node.decorator_list:
            self.visit(d)
        self._visit_defaults(node.args)
        self.in_header[-1] = False
        for s in body:
            self.visit(s)
        self.in_header.pop()
        self.scope.pop()
        self.stmt.pop()
        self.func_body.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def _visit_defaults(self, args: ast.arguments):
        for d in args.defaults + [d for d in args.kw_defaults if d is not None]:
            self.visit(d)

    def visit_Lambda(self, node):
        self._visit_defaults(node.args)
        self.visit(node.body)

    # -- statements
    def generic_visit(self, node):
        if isinstance(node, ast.stmt):
            self.stmt.append(node)
            super().generic_visit(node)
            self.stmt.pop()
        else:
            super().generic_visit(node)

    def visit_Expr(self, node):
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return  # a docstring or a bare string
        if isinstance(node.value, ast.Call) and self.func_body:
            self.stmt.append(node)
            self._add(node, "removed the statement", "pass", wrap=False)
            self.stmt.pop()
        self.generic_visit(node)

    def visit_AugAssign(self, node):
        self.stmt.append(node)
        if self.func_body:
            self._add(node, "removed the statement", "pass", wrap=False)
        op = SWAP_BINOP.get(type(node.op))
        if op:
            new = ast.AugAssign(node.target, op(), node.value)
            self._add(node, f"`{_op(node.op)}=` -> `{_op(op())}=`", ast.unparse(new), wrap=False)
        self.visit(node.value)
        self.stmt.pop()

    def visit_Assign(self, node):
        if any(isinstance(t, ast.Name) and t.id in STYLE_NAMES for t in node.targets):
            return
        self.stmt.append(node)
        if self.func_body and all(isinstance(t, (ast.Attribute, ast.Subscript)) for t in node.targets):
            self._add(node, "removed the statement", "pass", wrap=False)
        for t in node.targets:
            if isinstance(t, ast.Subscript):
                self.visit(t.slice)
        self.visit(node.value)
        self.stmt.pop()

    def visit_AnnAssign(self, node):
        if isinstance(node.target, ast.Name) and node.target.id in STYLE_NAMES:
            return
        self.stmt.append(node)
        if node.value is not None:
            self.visit(node.value)
        self.stmt.pop()

    def visit_Break(self, node):
        self._add(node, "removed `break`", "pass", wrap=False)

    def visit_Continue(self, node):
        self._add(node, "removed `continue`", "pass", wrap=False)

    def visit_If(self, node):
        self.stmt.append(node)
        if isinstance(node.test, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
            self._add(node.test, "negated the condition", "not " + _seg(self.lines, node.test))
        self.generic_visit_children(node)
        self.stmt.pop()

    def generic_visit_children(self, node):
        for child in ast.iter_child_nodes(node):
            self.visit(child)

    def visit_JoinedStr(self, node):
        return  # f-strings: messages and names

    def visit_arg(self, node):
        return  # annotations

    # -- expressions
    def visit_BinOp(self, node):
        op = SWAP_BINOP.get(type(node.op))
        if op:
            new = ast.BinOp(node.left, op(), node.right)
            self._add(node, f"`{_op(node.op)}` -> `{_op(op())}`", _unparse(new, self.lines, node))
        self.generic_visit(node)

    def visit_Compare(self, node):
        for i, cmp in enumerate(node.ops):
            op = SWAP_CMP.get(type(cmp))
            if op:
                ops = list(node.ops)
                ops[i] = op()
                new = ast.Compare(node.left, ops, node.comparators)
                self._add(node, f"`{_op(cmp)}` -> `{_op(op())}`", _unparse(new, self.lines, node))
        self.generic_visit(node)

    def visit_BoolOp(self, node):
        other = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        self._add(node, f"`{_op(node.op)}` -> `{_op(other)}`", _unparse(ast.BoolOp(other, node.values), self.lines, node))
        self.generic_visit(node)

    def visit_UnaryOp(self, node):
        axis = isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) and node.operand.value == 1
        # -1 is nearly always the last axis or element: -1 -> 1 on the (B, G) tensors of an
        # advantage mode is the same axis; the constant mutant -1 -> -2 still moves it
        if isinstance(node.op, (ast.Not, ast.USub, ast.Invert)) and not axis:
            self._add(node, f"dropped `{_op(node.op)}`", _seg(self.lines, node.operand))
        self.generic_visit(node)

    def visit_keyword(self, node):
        if node.arg in STYLE_KWARGS:
            return  # how a figure looks, not what it shows
        self.visit(node.value)

    def visit_Constant(self, node):
        v = node.value
        if isinstance(v, bool):
            self._add(node, f"`{v}` -> `{not v}`", repr(not v))
        elif isinstance(v, (int, float)):
            self._add(node, f"`{v!r}` -> `{v + 1!r}`", repr(v + 1))

    def visit_Call(self, node):
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in DROP_METHOD and not node.args and not node.keywords:
            self._add(node, f"dropped `.{f.attr}()`", _seg(self.lines, f.value))
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
        if name in SWAP_NAME and (isinstance(f, ast.Attribute) or name in BUILTIN_SWAPS):
            new_f = ast.Attribute(f.value, SWAP_NAME[name], ast.Load()) if isinstance(f, ast.Attribute) \
                else ast.Name(SWAP_NAME[name], ast.Load())
            new = ast.Call(new_f, node.args, node.keywords)
            self._add(node, f"`{name}` -> `{SWAP_NAME[name]}`", _unparse(new, self.lines, node))
        self.generic_visit(node)


def _docstring(node) -> bool:
    return bool(node.body) and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant) \
        and isinstance(node.body[0].value.value, str)


def _op(op) -> str:
    return {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "**", ast.FloorDiv: "//",
            ast.BitOr: "|", ast.BitAnd: "&", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
            ast.Eq: "==", ast.NotEq: "!=", ast.Is: "is", ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in",
            ast.And: "and", ast.Or: "or", ast.Not: "not", ast.USub: "-", ast.Invert: "~"}[type(op)]


def _unparse(new, lines, old) -> str:
    """The new node's source, its children copied from the file (f-strings and comments kept)."""
    if isinstance(new, ast.BinOp):
        return f"({_seg(lines, new.left)}) {_op(new.op)} ({_seg(lines, new.right)})"
    if isinstance(new, ast.Compare):
        out = f"({_seg(lines, new.left)})"
        for op, c in zip(new.ops, new.comparators):
            out += f" {_op(op)} ({_seg(lines, c)})"
        return out
    if isinstance(new, ast.BoolOp):
        return f" {_op(new.op)} ".join(f"({_seg(lines, v)})" for v in new.values)
    if isinstance(new, ast.Call):  # only the function name changed
        old_f, new_f = old.func, new.func
        # the receiver in parentheses: its segment leaves out any of its own, and `(~m).any()`
        # must not become `~m.all()`
        head = f"({_seg(lines, old_f.value)}).{new_f.attr}" if isinstance(new_f, ast.Attribute) else new_f.id
        whole = _seg(lines, old)
        return head + whole[len(_seg(lines, old_f)):]
    return ast.unparse(new)


def find_mutants(module: str) -> tuple[str, list[Mutant]]:
    source = (ROOT / module).read_text()
    finder = _Finder(module, source)
    tree = ast.parse(source)
    body = tree.body[1:] if _docstring(tree) else tree.body
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        finder.visit(node)
    seen: dict[tuple, int] = {}
    for m in finder.out:
        k = (m.qualname, m.desc, m.code)
        seen[k] = seen.get(k, 0) + 1
        m.key = f"{m.qualname}\t{m.desc}{f' ({seen[k]})' if seen[k] > 1 else ''}\t{m.code}"
    return source, finder.out


def apply(source: str, m: Mutant) -> str:
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for ln in lines:
        offsets.append(offsets[-1] + len(ln.encode()))
    b = source.encode()
    s = offsets[m.start[0] - 1] + m.start[1]
    e = offsets[m.end[0] - 1] + m.end[1]
    return (b[:s] + m.text.encode() + b[e:]).decode()


def diff_line(source: str, m: Mutant) -> str:
    new = apply(source, m).splitlines()
    return f"- {source.splitlines()[m.start[0] - 1].strip()}\n+ {new[m.start[0] - 1].strip()}"


# ------------------------------------------------------------------------ running


def preload() -> None:
    """Import what every test imports, once, before any fork; run no torch op here
    (a forked child must not inherit a started thread pool)."""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", "1")
    os.environ["TQDM_DISABLE"] = "1"
    import matplotlib
    matplotlib.use("Agg")
    for name in ["torch", "numpy", "pandas", "scipy.stats", "matplotlib.pyplot", "yaml", "pytest", "PIL.Image",
                 "tqdm", "hypothesis", "seaborn", "transformers", "peft", "triton"]:
        try:
            __import__(name)
        except Exception:  # noqa: BLE001  (an optional peer missing only costs time)
            pass


class _Tracer:
    """A pytest plugin: per test, the lines of one file it executes, and its duration."""

    def __init__(self, path: str):
        self.path, self.lines, self.durations = path, {}, {}
        self._cur, self._t0 = None, 0.0

    def _global(self, frame, event, arg):
        if frame.f_code.co_filename == self.path:
            self.lines[self._cur].add(frame.f_lineno)
            return self._local
        return None

    def _local(self, frame, event, arg):
        if event == "line":
            self.lines[self._cur].add(frame.f_lineno)
        return self._local

    def pytest_runtest_logstart(self, nodeid, location):
        import threading
        self._cur, self._t0 = nodeid, time.perf_counter()
        self.lines.setdefault(nodeid, set())
        sys.settrace(self._global)
        threading.settrace(self._global)

    def pytest_runtest_logfinish(self, nodeid, location):
        import threading
        sys.settrace(None)
        threading.settrace(None)
        self.durations[nodeid] = time.perf_counter() - self._t0


def _child(sandbox: Path, args: list[str], log: Path, trace: str | None = None, out: Path | None = None):
    """In a forked child: run pytest in the sandbox; exit with its code."""
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.chdir(sandbox)
        sys.path.insert(0, str(sandbox))
        os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # entry-point scanning costs seconds a run
        import torch
        torch.set_num_threads(int(os.environ.get("MUTATE_THREADS", "1")))
        import pytest
        plugins = []
        tracer = None
        if trace:
            tracer = _Tracer(str(sandbox / trace))
            plugins.append(tracer)
        code = pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:randomly", "--rootdir", str(sandbox),
                            "-o", "addopts=", *args], plugins=plugins)
        if tracer is not None:
            out.write_text(json.dumps({"lines": {k: sorted(v) for k, v in tracer.lines.items()},
                                       "durations": tracer.durations}))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(code))
    except BaseException:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(99)


def fork_pytest(sandbox, args, log, trace=None, out=None) -> int:
    pid = os.fork()
    if pid == 0:
        os.setpgid(0, 0)
        _child(sandbox, args, log, trace, out)
    return pid


def make_sandbox(base: Path) -> Path:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    for f in files:
        if not f:
            continue
        src = ROOT / f.decode()
        if not src.is_file():
            continue
        dst = base / f.decode()
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
    # untracked test files being written alongside (they are what is under test here)
    for extra in list((ROOT / "tests").glob("test_*.py")) + [ROOT / "scripts" / "mutants_equivalent.tsv"]:
        if extra.is_file() and not (base / extra.relative_to(ROOT)).exists():
            shutil.copy2(extra, base / extra.relative_to(ROOT))
    return base


def _kept_log(module: str, log: Path) -> Path:
    """A failed baseline's log, copied beside the module's cache: the work directory is removed on exit, and
    the message once pointed into it (a failure that passed in one plain pytest process could not be read)."""
    kept = _cache(module).with_suffix(".baseline.log")
    kept.parent.mkdir(exist_ok=True)
    shutil.copy2(log, kept) if log.exists() else kept.write_text("(pytest wrote no log)\n")
    return kept


def baseline(module: str, tests: list[str], sandbox: Path, work: Path) -> dict:
    out, log = work / "baseline.json", work / "baseline.log"
    pid = fork_pytest(sandbox, tests, log, trace=module, out=out)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code != 0 or not out.exists():
        sys.exit(f"{module}: the tests fail before any mutation (exit {code}); see {_kept_log(module, log)}")
    base = json.loads(out.read_text())
    base["untraced"] = UNTRACED.get(module, [])
    if base["untraced"]:
        t0 = time.perf_counter()
        _, status = os.waitpid(fork_pytest(sandbox, base["untraced"], work / "untraced.log"), 0)
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"{module}: the untraced tests fail before any mutation; see "
                     f"{_kept_log(module, work / 'untraced.log')}")
        for t in base["untraced"]:  # their time shared out: a mutant's limit counts them
            base["durations"][t] = (time.perf_counter() - t0) / len(base["untraced"])
    return base


def covering(m: Mutant, base: dict) -> list[str]:
    durations = base["durations"]
    if m.anchor is None:
        tests = list(durations)
    else:
        lo, hi = m.anchor
        tests = [t for t, lines in base["lines"].items() if any(lo <= ln <= hi for ln in lines)]
    # the untraced ones may reach any line: after the traced, for every mutant (and never counted twice)
    untraced = base.get("untraced", [])
    return sorted((t for t in tests if t not in untraced), key=lambda t: durations.get(t, 0.0)) + untraced


def load_equivalent() -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    if EQUIVALENT.exists():
        for line in EQUIVALENT.read_text().splitlines():
            if not line.strip() or line.startswith("#"):
                continue
            module, qual, desc, code, reason = line.split("\t")
            out.setdefault(module, {})[f"{qual}\t{desc}\t{code}"] = reason
    return out


def run_module(module: str, tests: list[str], sandboxes: list[Path], work: Path, equivalent: dict,
               verbose: bool, sample: int = 1, only: set | None = None) -> tuple[list[Mutant], float, str]:
    t0 = time.perf_counter()
    source, mutants = find_mutants(module)
    mutants = mutants[::sample]  # every k-th, in file order: the same sample every time
    if only is not None:  # --survivors: the rest keep the status of the last run
        mutants = [m for m in mutants if m.key in only]
    base = baseline(module, tests, sandboxes[0], work)
    known = equivalent.get(module, {})
    todo = []
    for m in mutants:
        if m.key in known:
            m.status, m.reason = "equivalent", known[m.key]
        elif not covering(m, base):
            m.status = "no test"
        else:
            todo.append(m)
    free = list(range(len(sandboxes)))
    running: dict[int, tuple[Mutant, int, float, float]] = {}  # pid -> (mutant, sandbox, start, limit)
    done = 0

    def finish(pid, code):
        nonlocal done
        m, k, start, _ = running.pop(pid)
        _write(sandboxes[k] / module, source)
        m.seconds = time.perf_counter() - start
        if code == "timeout":
            m.status = "timeout"
        elif code == 0:
            m.status = "survived"
        elif code in (1, 2, 3):  # tests failed, interrupted, internal error (an import raised)
            m.status = "killed"
            m.by = _first_failure(work / f"mutant{k}.log")
        else:
            m.status, m.by = "killed", f"exit {code}"
        free.append(k)
        done += 1
        if verbose or m.status == "survived":
            print(f"  [{done}/{len(todo)}] {m.status:8s} {m.qualname}: {m.desc}  `{m.code}`", flush=True)

    queue = list(todo)
    while queue or running:
        while queue and free:
            m = queue.pop(0)
            k = free.pop()
            tests_m = covering(m, base)
            limit = 3 * sum(base["durations"].get(t, 1.0) for t in tests_m) + 20
            _write(sandboxes[k] / module, apply(source, m))
            pid = fork_pytest(sandboxes[k], ["-x", *tests_m], work / f"mutant{k}.log")
            running[pid] = (m, k, time.perf_counter(), limit)
        time.sleep(0.02)
        for pid in list(running):
            got, status = os.waitpid(pid, os.WNOHANG)
            if got:
                finish(pid, os.waitstatus_to_exitcode(status))
            elif time.perf_counter() - running[pid][2] > running[pid][3]:
                os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                finish(pid, "timeout")
    return mutants, time.perf_counter() - t0, source


_STAMP = [int(time.time()) + 10**7]


def _write(path: Path, text: str) -> None:
    """Write a module with an mtime never used before: a cached .pyc (keyed on mtime and size)
    is then never taken for this text, while the untouched modules keep theirs."""
    path.write_text(text)
    _STAMP[0] += 1
    os.utime(path, (_STAMP[0], _STAMP[0]))


def _first_failure(log: Path) -> str:
    try:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith(("FAILED ", "ERROR ")):
                return line.split(" ", 1)[1].split(" - ")[0]
    except OSError:
        pass
    return ""


# ------------------------------------------------------------------------ report


def score(ms: list[Mutant]) -> dict:
    c = {s: sum(m.status == s for m in ms) for s in ("killed", "timeout", "survived", "no test", "equivalent")}
    live = len(ms) - c["equivalent"]
    c["mutants"] = len(ms)
    c["score"] = (c["killed"] + c["timeout"]) / live if live else 1.0
    return c


COUNTS = ("mutants", "killed", "timeout", "survived", "no test", "equivalent")


def _short(module: str) -> str:
    """A module's name in the equivalents' table: its path inside the package (stats/ and sweep/ both have a
    sequential.py)."""
    return module.removeprefix("grpo_bench/")


def committed(report: Path = REPORT) -> dict[str, dict]:
    """The committed report's rows, module -> {"row": its table line, counts, "seconds", "left": its survivor
    lines, "why": its equivalent mutants' lines}: what --report keeps for a module whose run is not cached
    here (.cache/ is a machine's, and a module's run takes up to an hour: the row stands until it is rerun)."""
    try:
        text = report.read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `grpo_bench/") and len(cells) == 10:
            module = cells[0].strip("`")
            counts = dict(zip(COUNTS, (int(cells[2].split()[0]), *map(int, cells[3:8]))))
            out[module] = {"row": line, **counts, "seconds": 60 * float(cells[9].split()[0]),
                           "left": [], "why": []}
    for line in text.splitlines():
        for module, entry in out.items():
            if line.startswith(f"- `{module}` "):
                entry["left"].append(line)
            elif line.startswith(f"| `{_short(module)}` |"):
                entry["why"].append(line)
    return out


def write_report(results: dict, jobs: int, total_s: float, kept: dict | None = None) -> None:
    """kept: rows of the committed report (committed()) for modules run before, not in results."""
    kept = {m: e for m, e in (kept or {}).items() if m not in results}
    total_s += sum(e["seconds"] for e in kept.values())
    lines = ["# Mutation testing", "",
             f"`scripts/mutate.py` (see its docstring) on a {os.cpu_count()}-core machine shared with other jobs; "
             f"total {total_s / 60:.1f} min. Score = killed / (mutants - equivalent); a timeout counts as killed. "
             "Time: wall time of that module's run, `jobs` workers.",
             "", "| module | tests | mutants | killed | timeout | survived | no test | equivalent | score | time (jobs) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for module in MODULES:
        if module in kept:
            lines.append(kept[module]["row"])
            continue
        if module not in results:
            continue
        ms, secs, sample, jobs_ = results[module]
        c = score(ms)
        tests = ", ".join(Path(t).name if t.startswith("tests/") else f"`{t}`" for t in MODULES[module])
        sampled = f" (1 in {sample})" if sample > 1 else ""
        lines.append(f"| `{module}` | {tests} | {c['mutants']}{sampled} | {c['killed']} | {c['timeout']} | {c['survived']} | "
                     f"{c['no test']} | {c['equivalent']} | {100 * c['score']:.1f}% | {secs / 60:.1f} min ({jobs_}) |")
    allm = [m for ms, *_ in results.values() for m in ms]
    c = score(allm)
    for k in COUNTS:
        c[k] += sum(e[k] for e in kept.values())
    live = c["mutants"] - c["equivalent"]
    c["score"] = (c["killed"] + c["timeout"]) / live if live else 1.0
    lines.append(f"| **all** | | {c['mutants']} | {c['killed']} | {c['timeout']} | {c['survived']} | {c['no test']} | "
                 f"{c['equivalent']} | {100 * c['score']:.1f}% | {total_s / 60:.1f} min |")
    left = [m for m in allm if m.status in ("survived", "no test")]
    lines += ["", "## Survivors", ""]
    lines += ([f"- `{m.module}` {m.qualname}: {m.desc} in `{m.code}` ({m.status})" for m in left]
              + [x for e in kept.values() for x in e["left"]]) or ["None."]
    lines += ["", "## Equivalent mutants", "",
              "Listed in `scripts/mutants_equivalent.tsv`; each change cannot alter what the code computes "
              "(or only in a way no caller can observe), for the reason given.", "",
              "| module | where | change | line | why equivalent |", "|---|---|---|---|---|"]
    for module in MODULES:
        lines += kept[module]["why"] if module in kept else []
        for m in results.get(module, ([],))[0]:
            if m.status == "equivalent":
                code = m.code.replace("|", "\\|")
                lines.append(f"| `{_short(m.module)}` | {m.qualname} | {m.desc} | `{code}` | {m.reason} |")
    REPORT.write_text("\n".join(lines) + "\n")


def _cache(module: str) -> Path:
    return ROOT / ".cache" / f"mutate-{module.replace('/', '_')}.json"


def _load_cached(module: str) -> tuple[list[Mutant], float]:
    try:
        data = json.loads(_cache(module).read_text())
    except OSError:
        sys.exit(f"{module}: no earlier run in {_cache(module)}; run scripts/mutate.py {module} first")
    fields = Mutant.__dataclass_fields__
    return [Mutant(**{k: v for k, v in m.items() if k in fields}) for m in data["mutants"]], data["seconds"], \
        data.get("sample", 1), data.get("jobs", 2)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("modules", nargs="*", help="modules to mutate (default: all of MODULES, and write the report)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--show", action="store_true", help="print each survivor's diff")
    ap.add_argument("--sample", type=int, default=1, metavar="K",
                    help="run every K-th mutant only (the same ones every time); the report says so")
    ap.add_argument("--list", action="store_true", help="list the mutants, run nothing")
    ap.add_argument("--survivors", action="store_true",
                    help="run again only the last run's survivors of each module (after adding tests), mutants "
                         "no longer listed as equivalent and those of lines edited since; keep the rest")
    ap.add_argument("--report", action="store_true",
                    help="write results/mutation.md from the last run of each module (kept in .cache/; a module not "
                         "run on this machine keeps its row of the committed report), run nothing")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    modules = args.modules or list(MODULES)
    for m in modules:
        if m not in MODULES:
            ap.error(f"{m}: not in MODULES; valid: {', '.join(MODULES)}")
    if args.list:
        for mod in modules:
            source, ms = find_mutants(mod)
            for m in ms:
                print(f"{mod}\t{m.key}\n{diff_line(source, m)}")
        return 0
    if args.report:
        results, total = {}, 0.0
        equivalent = load_equivalent()
        kept = committed() if not args.modules else {}
        for mod in modules:
            if not _cache(mod).exists() and mod in kept:  # run on another machine: its committed row stands
                continue
            ms, secs, sample, jobs = _load_cached(mod)
            known = equivalent.get(mod, {})
            for m in ms:  # the list of equivalents may have changed since that run
                if m.status in ("survived", "no test") and m.key in known:
                    m.status, m.reason = "equivalent", known[m.key]
                elif m.status == "equivalent" and m.key not in known:  # its row was dropped: not shown as settled
                    m.status, m.reason = "survived", ""
            results[mod] = (ms, secs, sample, jobs)
            # the minutes its row shows: the total is then the rows' sum, as a report rewritten from rows gives it
            total += 60 * round(secs / 60, 1)
        # a row whose line no longer exists (the code moved or changed) explains nothing: the table would count
        # rows that match no mutant
        keys = {(mod, m.key) for mod, (ms, *_) in results.items() for m in ms}
        # a sampled module's row may explain a mutant outside the sample: stale only if no mutant of the
        # module as it is now matches it
        keys |= {(mod, m.key) for mod, (_, _, sample, _) in results.items() if sample > 1
                 for m in find_mutants(mod)[1]}
        stale = [f"{mod}\t{k}" for mod in results for k in equivalent.get(mod, {}) if (mod, k) not in keys]
        if stale:
            print("\n".join(["rows of scripts/mutants_equivalent.tsv that match no mutant of the last run "
                              "(remove them, or run the module again):", *stale]), file=sys.stderr)
            return 1
        write_report(results, args.jobs, total, kept)
        print(f"wrote {REPORT.relative_to(ROOT)}")
        return 0
    preload()
    equivalent = load_equivalent()
    results = {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mutate-") as tmp:
        work = Path(tmp)
        sandboxes = [make_sandbox(work / f"repo{k}") for k in range(args.jobs)]
        for mod in modules:
            print(f"{mod}: tests {' '.join(MODULES[mod])}", flush=True)
            only, previous, sample = None, None, args.sample
            if args.survivors:
                previous, prev_secs, sample, _ = _load_cached(mod)
                # the module as it is now: a line edited since has new mutants (run), and the old ones are gone
                now = {m.key: m for m in find_mutants(mod)[1][::sample]}
                current = list(now)
                known = {m.key for m in previous}
                # and those whose equivalent row was dropped since (it turned out not to be)
                only = {m.key for m in previous if m.status in ("survived", "no test")
                        or (m.status == "equivalent" and m.key not in equivalent.get(mod, {}))} \
                    | (set(current) - known)
            ms, secs, source = run_module(mod, MODULES[mod], sandboxes, work, equivalent, args.verbose, sample, only)
            if previous is not None:  # merge: the re-run mutants' new status, the others' as it was
                again, old = {m.key: m for m in ms}, {m.key: m for m in previous}
                # a kept mutant keeps its result at its place in the module as it is now (lines above it may
                # have moved since)
                for k in current:
                    if k not in again:
                        for f in ("status", "reason", "by", "seconds"):
                            setattr(now[k], f, getattr(old[k], f))
                ms, secs = [again.get(k, now[k]) for k in current], prev_secs + secs
            results[mod] = (ms, secs, sample, args.jobs)
            c = score(ms)
            print(f"{mod}: {c['mutants']} mutants, {c['killed']} killed, {c['timeout']} timeout, {c['survived']} "
                  f"survived, {c['no test']} no test, {c['equivalent']} equivalent: score {100 * c['score']:.1f}% "
                  f"in {secs:.0f} s", flush=True)
            if args.show:
                for m in ms:
                    if m.status in ("survived", "no test"):
                        print(f"{m.status}: {m.module}\t{m.key}\n{diff_line(source, m)}\n", flush=True)
            _cache(mod).parent.mkdir(exist_ok=True)
            _cache(mod).write_text(json.dumps({"seconds": secs, "jobs": args.jobs, "sample": sample, "mutants": [
                {**vars(m), "diff": diff_line(source, m)} for m in ms]}, indent=1))
    total = time.perf_counter() - t0
    if not args.modules:
        write_report(results, args.jobs, total)
        print(f"wrote {REPORT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
