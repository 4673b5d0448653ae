#!/usr/bin/env bash
# The reproduction study's grids (docs/RESULTS.md) on one GPU, in order of importance, within a deadline.
#
#   OUT=/tmp/out bash benchmarks/study_gpu.sh 470 /tmp/study.db          # seconds; the working store
#   DEVICE=cpu WORKERS=2 LIMIT=64 GRIDS=label_shift bash benchmarks/study_gpu.sh 900 /tmp/try.db  # a try
#   GRIDS="batch1 my/part.yaml" bash benchmarks/study_gpu.sh 525 /tmp/study.db  # chosen grids
#   SELECT=0 GRIDS=seeds_wild_vit bash benchmarks/study_gpu.sh 450 /tmp/study.db  # no rate selection first
#   SELECT=0 GRIDS=" " VARIANT=every=4,rows=16 bash benchmarks/study_gpu.sh 470 /tmp/study.db  # a guard variant
#   SELECT=0 SEVERITIES="1 2 3 4 5" GRIDS=guard_heldout bash benchmarks/study_gpu.sh 470 /tmp/study.db  # held out
#   SELECT=0 REMAKE=gpu METHODS=deyo,come GRIDS=label_shift bash benchmarks/study_gpu.sh 470 /tmp/study.db
#       # the grid's runs of those methods stored from a GPU made again here (zerosiam bench --remake-from)
#   SELECT=0 ONE_DEVICE=1 GRIDS="guard_falls guard_gains guard_noise guard_mixed guard_blind_spot guard_epochs" \
#     bash benchmarks/study_gpu.sh 470 /tmp/study.db  # the guard cells set aside across devices, made again here
#
# SEVERITIES (default 5) are the severities built first: the gradual stream reads all five.
# The working store starts as a SQLite copy of the committed text store docs/results/study, so a fresh machine goes on
# where the study stands. The script builds the 15 + 4 corruptions at severity 5 (one process each),
# chooses every method's rates with `zerosiam select-lr` on the 4 extra corruptions (one command per
# model, side by side; runs already stored are not redone; SELECT=0 skips it and keeps the rates the store
# recorded), then runs the grids of docs/results/grids/
# with those rates, in the order below (batch-size-1 runs stacked as streams: `bench --stack`). Each step
# gets what is left of the deadline and is stopped with
# SIGTERM when it runs out: the store keeps every finished run, and the same command resumes. At the end
# $OUT holds the store with the figures' curves only (benchmarks/study_export.py), gzipped in 15 MB
# parts, the logs, and the checkpoints of the tasks the deadline stopped ($OUT/checkpoints, every
# ${CHECKPOINT_EVERY:-120} s); merge the store with `python benchmarks/study_export.py study.db
# docs/results/study`, and put the checkpoints in .gpu/checkpoints (carried to the next call, which
# goes on with those tasks from there, on this machine or a fresh one).
# With VARIANT (NAME=VALUE,... of benchmarks/guard_variants.py), before the grids, that variant of `auto` runs
# on the three GN/LN models' cells of the guard grids (${VARIANT_GRIDS}, batch 64), in one process per worker
# (--shard), into a store of its own (/tmp/variants.db, starting as a copy of docs/results/guard_variants);
# $OUT/guard_variants gets that text store with the new runs added (replace the committed one with it) and
# $OUT/variant.md the grid's judged table.
# Measured on an H100 (16 cores): 1.25 batch-64 runs/s with 15 workers.
set -u
export PYTHONUNBUFFERED=1
python -c "import torch, yaml, tqdm, safetensors; print('torch', torch.__version__, torch.cuda.is_available())"
deadline=$(( $(date +%s) + ${1:-540} ))
db=${2:-/tmp/study.db}  # the whole store, every curve; $OUT gets the export (benchmarks/study_export.py)
out=${OUT:-runs/study}
logs=/tmp/study_logs
mkdir -p "$logs" "$out" "$(dirname "$db")"
working_copy() {  # working_copy TEXT_STORE DB: DB as a SQLite copy of the committed TEXT_STORE, unless there
  [[ -f $2 ]] || python -c "import shutil, sys; from zerosiam.bench.textstore import open_store
shutil.copy(open_store(sys.argv[1]).path, sys.argv[2])" "$1" "$2"
}
working_copy docs/results/study "$db"
carried=${CHECKPOINTS:-.gpu/checkpoints}  # the last call's unfinished tasks
if compgen -G "$carried/*.pt" > /dev/null; then mkdir -p "$db.checkpoints" && cp -n "$carried"/*.pt "$db.checkpoints/"; fi
workers=${WORKERS:-$(( $(nproc) - 1 ))}
VARIANT_GRIDS=${VARIANT_GRIDS:-guard_falls.yaml,guard_gains.yaml,guard_noise.yaml,guard_mixed.yaml,guard_epochs.yaml}
device=${DEVICE:-cuda}
left() { echo $(( deadline - $(date +%s) )); }

step() {  # step NAME 'COMMAND': run with what is left of the deadline (SIGTERM then), log its time
  local name=$1 start rc
  if (( $(left) < 20 )); then echo "$name: skipped, deadline"; return; fi
  start=$(date +%s)
  timeout -s TERM -k 30 "$(left)" bash -c "$2" > "$logs/$name.log" 2>&1; rc=$?
  echo "$name: exit $rc after $(( $(date +%s) - start )) s, $(stored) runs stored"
}
stored() { [[ -f $db ]] && python -c "import sqlite3, sys
print(sqlite3.connect(sys.argv[1]).execute('select count(*) from runs').fetchone()[0])" "$db"; }

build() {  # build CORRUPTION [SEVERITY]: the cached array at SEVERITY (default 5; the clean set is "clean")
  python -c "import sys; from zerosiam.corruptions.datasets import load_corrupted
load_corrupted('cifar10c', sys.argv[1], int(sys.argv[2]), progress=False)" "$1" "${2:-5}"
}

select_rates() {  # select_rates MODEL METHODS WORKERS: the rates of METHODS on MODEL, on the extra corruptions
  python -m zerosiam select-lr --model "$1" --methods "$2" --lr-scale 1,0.3,3,10,30 --protocol label_shift \
    --db "$db" --workers "$3" --device "$device" ${LIMIT:+--limit $LIMIT}
}

bench() {  # bench GRID [WORKERS]: a grid of docs/results/grids (or a .yaml path) with the selected rates, batch-1 stacked
  local grid=$1; [[ $grid == *.yaml ]] || grid=docs/results/grids/$grid.yaml
  python -m zerosiam bench --grid "$grid" --db "$db" --device "$device" \
    --workers "${2:-$workers}" --no-report --stack --checkpoint-every "${CHECKPOINT_EVERY:-120}" ${LIMIT:+--limit $LIMIT} \
    ${METHODS:+--methods "$METHODS"} ${REMAKE:+--remake-from "$REMAKE"} ${ONE_DEVICE:+--one-device}
}

command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv -l 15 \
  > "$logs/gpu.csv" 2>&1 &
export -f build select_rates bench
export db device workers LIMIT CHECKPOINT_EVERY METHODS REMAKE ONE_DEVICE
step data_clean "build clean"  # first alone: it decodes the clean test set that every build reads
names=$(python -c "from zerosiam import corruptions; print(*corruptions.BENCHMARK, *corruptions.EXTRA)")
step data "for name in $names; do for severity in ${SEVERITIES:-5}; do build \$name \$severity & done; done; wait"

if [[ -n ${VARIANT:-} ]]; then
  vdb=/tmp/variants.db
  working_copy docs/results/guard_variants "$vdb"
  variant() {  # variant [FLAGS]: benchmarks/guard_variants.py on the variant's cells
    PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} python benchmarks/guard_variants.py --model resnet26_gn,convnext_nano_ln,vit_tiny_ln --variant "$VARIANT" \
      --grids "$VARIANT_GRIDS" --db "$vdb" --device "$device" "$@"
  }
  export -f variant; export VARIANT VARIANT_GRIDS vdb logs
  step variant 'for i in $(seq 0 $(( workers - 1 ))); do variant --shard $i/$workers > $logs/variant_$i.log 2>&1 & done; wait'
  cp -r docs/results/guard_variants "$out/" && variant --judge-only --export "$out/guard_variants" > "$out/variant.md"
fi

baselines=tent,sar,eata,deyo,come,zerosiam
per=$(( (workers + 3) / 4 ))
if [[ ${SELECT:-1} == 1 ]]; then step select "
select_rates resnet26_gn $baselines,eata+zerosiam,deyo+zerosiam $per &
select_rates vit_tiny_ln $baselines,eata+zerosiam,deyo+zerosiam $per &
select_rates convnext_nano_ln $baselines $per &
select_rates resnet20 $baselines $per &
wait"
else echo "select: skipped (SELECT=0: the rates the store recorded)"; fi

# what the 2-core machine cannot do first: the batch-1 tables (stacked: a model and method's 15 corruptions,
# under every seed the grid names, per process)
for grid in ${GRIDS:-label_shift batch1 blind_spot mild_mixed label_shift_seeds ablation_compositions \
    ablation_predictor ablation_alpha ablation_rates_resnet26_gn ablation_rates_vit_tiny_ln ablation_objective}; do
  # a stacked task (15 runs of 10,000 steps a seed) is stored when it ends: few at once, so that some end in time;
  # on an H100, 4 at once slowed each other by about 5 %, 12 at once shared it (one of 12 ended in 543 s)
  name=$(basename "$grid" .yaml)
  case $name in batch1*|blind_spot*|seeds_wild*) step "$name" "bench $grid ${STACK_WORKERS:-4}" ;; *) step "$name" "bench $grid" ;; esac
done
python benchmarks/study_export.py "$db" "$out/study.db"
python -c "import sqlite3, sys; sqlite3.connect(sys.argv[1]).execute('PRAGMA wal_checkpoint(TRUNCATE)')" "$out/study.db"
gzip -f "$out/study.db" && split -b 15M -d "$out/study.db.gz" "$out/study.db.gz." && rm "$out/study.db.gz"
kill %1 2> /dev/null
if compgen -G "$db.checkpoints/*.pt" > /dev/null; then mkdir -p "$out/checkpoints" && cp "$db.checkpoints"/*.pt "$out/checkpoints/"; fi
tar -czf "$out/logs.tar.gz" -C "$logs" .
ls -la "$out"
