#!/usr/bin/env bash
# Rebuild everything under results/ from scratch, in the order the README presents it:
# the five sorting ablations, the arithmetic ablation, every setting of every claim
# ablation, then FINDINGS.md, the toy-vs-LM comparison and the gallery.
# The toy and arithmetic-LM settings take about 90 minutes on 2 CPU cores; every claim's
# reasoning-gym settings (countdown: 60-80 s a run on one core; spell_backward: 40-55 s) and the
# wide start's (lm_wide: about 85 s a run) add roughly 15 core-hours (those committed by
# 2026-11-27 took 14.5: 10.8 summed from their sweep.json, then sampler_mismatch's 3.7 at 10 seeds),
# so name what you want: each line
# prints its wall time so that the README's timings can be checked. Pass ablation names to run
# only those (e.g. `loss_modes recipes`, or `dapo_ladder:countdown` for one setting).
# Every claim's `lm_acts` setting (8 optimizer steps a rollout, 10 seeds, 530 runs) was made on an H200
# (`bash scripts/gpu_run.sh acts`: 8.8 min over two calls, the second finishing two sweeps the first stopped; results/gpu/acts_sweeps.csv); on a CPU it
# is about 26 core-hours (a one-seed probe: 45 s of training for 8 of its 30 rollouts on one core, plus seven
# evaluations of 1,000 problems), so reproduce.sh runs it only when named (e.g. `dapo_ladder:lm_acts`).
# results/gpu/ is a GPU's: `bash scripts/gpu_run.sh all`, then `bash scripts/gpu_run.sh claims`, `acts`, `smollm2`.
# The shipped starts (tasks/*/) are inputs, not results: `python -m grpo_bench build-start tasks/X.yaml`;
# the arithmetic starts a claim replicates on (settings lm_seed<N>: kl_gradients and sampler_mismatch on seeds 1
# and 2) are `build-start tasks/arithmetic_scratchpad.yaml --seed N`, 11-12 min each on one core (2026-11-28,
# beside other work). An lm_seed setting is 25 runs with every evaluation on all 1,000 problems, each about
# 0.7-1.4 core-hours on 2 workers (their sweep.json: sampler_mismatch_lm_seed1 1,490 s, sampler_mismatch_lm_seed2
# 1,333 s and kl_gradients_lm_seed2 1,499 s alone, kl_gradients_lm_seed1 2,436 s with other work beside it).
# The spell_backward_slow settings (lr 1e-4, 15 rollouts, 5 seeds, every evaluation on all 1,000 words) take on
# 2 workers (their sweep.json): adv_norm_spell_backward_slow 659 s, aggregation_spell_backward_slow 568 s,
# length_bias_spell_backward_slow 590 s, sampler_mismatch_spell_backward_slow 682 s.
# The lm settings rerun with every evaluation on all 1,000 problems take on 2 workers (their sweep.json, Intel
# Xeon): adv_norm_lm 2,410 s, length_bias_lm 1,456 s, aggregation_lm 1,195 s, dapo_ladder_lm 1,886 s,
# entropy_control_lm 881 s, policy_losses_lm 1,477 s, ref_policy_lm 1,197 s, kl_gradients_lm 3,044 s (fp32: 100-135
# s a run on one core), fp32_head_lm 3,989 s (bf16, 660-930 s a run on this CPU, part of it beside other work);
# on spell_backward (all 1,000 words, 135-160 s a run on one core): entropy_control_spell_backward 1,108 s,
# length_bias_spell_backward 1,492 s; on an AMD EPYC (Zen 4, 2 workers, the same pin, about 1.7x the Xeon's
# speed on entropy_control's spell_backward sweep): aggregation_spell_backward 1,095 s,
# ref_policy_spell_backward 935 s, adv_norm_spell_backward 1,244 s, entropy_control_countdown 1,096 s,
# aggregation_countdown 1,377 s, length_bias_countdown 1,389 s, policy_losses_spell_backward 1,034 s,
# policy_losses_lm_wide 2,552 s (the runs they replace took 724, 839, 1,082 and 1,086 s on the native paths
# of another AMD EPYC with 250-problem mid-run evaluations, the third at load 4, beside other work);
# kl_gradients_spell_backward 2,627 s, its first 20 minutes beside the test suite (the run it replaces: 1,180 s);
# sampler_mismatch_spell_backward 2,591 s for seeds 5-9 of its 10 (its sweep.json; seeds 0-4 took 2,670 s before
# it resumed; the run it replaces likewise took 1,328 s for its seeds 5-9); sampler_mismatch_lm 2,258 s,
# dapo_ladder_spell_backward 1,332 s, dapo_ladder_lm_wide 3,162 s (the runs they replace: 1,310, 1,340 and
# 1,355 s), dapo_ladder_countdown 2,441 s, policy_losses_countdown 2,001 s (the runs they replace: 1,945 s on one
# worker and 1,860 s), kl_gradients_countdown 3,901 s (the run it replaces: 1,907 s; the 1,000-problem countdown
# evaluations double a run's time, 150-175 s on one core); sampler_mismatch_countdown 3,138 s for the last 30
# of its 110 runs (its sweep.json, the last invocation's: the sweep was resumed across sessions; its 110 runs' own wall
# times sum to 19,432 s, 5.4 core-hours, 130-312 s a run, the bf16 and fp16 samplers' about 237 s, and runs
# beside other work slower; the run it replaces: 2,090 s for its last 55); ref_policy_countdown 3,758 s (its first
# CPU run: the runs it is judged before are a GPU's, results/gpu/ref_policy_countdown, with 250-problem mid-run
# evaluations; partly beside other work), adv_norm_countdown 3,185 s (likewise its first CPU run, before
# results/gpu/adv_norm_countdown; 101-124 s a run with nothing beside it); on an AMD EPYC (Zen 5),
# sampler_mismatch_lm_wide 2,501 s for the last 15 of its 55 runs (its sweep.json, the last invocation's: the sweep
# was resumed across sessions; its 55 runs' own wall times sum to 14,173 s, 3.9 core-hours, 146-414 s a run, the
# bf16 and fp16 samplers' 405-414 s, the others' 146-322 s; the run it replaces: 3,651 s). fp32_head's countdown
# and spell_backward settings (10 bf16 runs each, about 2.5 core-hours each here) have not been rerun since
# the claim put the fp32 head on both sides.
# The kernel benchmarks are separate (README, Kernels): they want an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=.venv/bin/python
export OMP_WAIT_POLICY=PASSIVE   # busy-waiting OpenMP threads slow the other worker

sort_ablations=(loss_modes delta_modes kl_estimators ref_refresh recipes)
lm_ablations=(arithmetic_lora countdown_grpo spell_backward_grpo)
claims=(adv_norm dapo_ladder policy_losses kl_gradients length_bias ref_policy sampler_mismatch aggregation entropy_control fp32_head)
wanted=("$@")

# an ablation's name runs all of it; name:setting (e.g. policy_losses:sort) one setting of a claim
want() { [ ${#wanted[@]} -eq 0 ] || [[ " ${wanted[*]} " == *" $1 "* ]]; }
timed() { local t0=$SECONDS; "$@"; echo "[reproduce] $* : $((SECONDS - t0)) s" >&2; }

for a in "${sort_ablations[@]}" "${lm_ablations[@]}"; do
  # a run directory of the same config is resumed, not re-run: clear it, the code may have changed
  want "$a" && rm -rf "results/$a" && timed $PY -m grpo_bench run "ablations/$a.yaml" --no-progress
done
# spell_backward at lr 1e-4 (5 seeds, 508 s on 2 workers): the separate default-GRPO run whose rollout-15
# evaluation sets the spell_backward_slow settings' margins (tests/test_doc_numbers.py holds them to it)
want spell_backward_grpo && rm -rf results/spell_backward_grpo_lr1e-4 && timed $PY -m grpo_bench run \
  ablations/spell_backward_grpo.yaml --set lr=0.0001 --set eval_every=5 --out results/spell_backward_grpo_lr1e-4 --no-progress
for a in "${claims[@]}"; do
  for s in $($PY -c "import yaml,sys; print(' '.join(yaml.safe_load(open(sys.argv[1]))['settings']))" "ablations/$a.yaml"); do
    if [ "$s" = lm_acts ]; then [[ " ${wanted[*]} " == *" $a:$s "* ]] || continue   # a GPU's, unless named
    else want "$a:$s" || want "$a" || continue; fi
    rm -rf "results/${a}_$s"
    timed $PY -m grpo_bench run "ablations/$a.yaml" --setting "$s" --no-progress
  done
done
$PY -m grpo_bench findings results
[ -d results/policy_losses_sort ] && [ -d results/policy_losses_lm ] && \
  $PY -m grpo_bench compare results/policy_losses_sort results/policy_losses_lm
for a in kl_gradients sampler_mismatch; do   # the variance each variant owes to its start
  starts=$(ls -d "results/${a}_lm" "results/${a}_lm_seed"[0-9]* 2>/dev/null || true)
  [ "$(echo $starts | wc -w)" -ge 2 ] && $PY -m grpo_bench compare $starts --out "results/starts_${a}_lm"
done
$PY -m grpo_bench gallery results
