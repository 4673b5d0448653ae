#!/usr/bin/env bash
# The GPU speed tables in one call: the harness eager and with each speed option, beside the plain Tent
# loop, with MFU per row and a profile, for ViT-B/16 and ResNet-50-GN in tf32 and bf16 at batch 64, and
# ViT-B/16 in tf32 at batch size 1 (benchmarks/gpu_check.py; tables in docs/efficiency.md).
#
#   OUT=/tmp/out bash benchmarks/gpu_speed.sh          # one H100 or H200; stops at 420 s
#   OUT=/tmp/out bash benchmarks/gpu_speed.sh 300      # another deadline, in seconds
#   DEVICE=cpu IMAGES=128 IMAGES_BS1=8 VIT=test_vit RESNET=test_resnet OUT=/tmp/try \
#       bash benchmarks/gpu_speed.sh 900               # a try of the script itself on a CPU
#   STEPS="vit64 guard_cost" OUT=/tmp/out bash benchmarks/gpu_speed.sh   # only these steps, in the order below
#
# Steps, in order of importance; each gets what is left of the deadline and is stopped with SIGTERM when it
# runs out (what it measured is kept: gpu_check.py appends every row to rows.jsonl as it goes):
#   graph64   ViT-B/16, batch 64, tf32 and bf16: Tent, ZeroSiam and SAR eager, the plain loop, then each
#             with the fixed-shape step and with that step captured as a CUDA graph (zerosiam.methods.capture)
#   graph1    the same at batch size 1, tf32
#   attention64  ViT-B/16, batch 64, tf32: Tent and ZeroSiam with attention on the math path (TF32 tensor
#             cores) and on cuDNN, and the math path captured
#   bf16w64   ViT-B/16, batch 64, bf16: Tent and ZeroSiam with the frozen weights stored in bf16, and captured
#   decode64  ViT-B/16, batch 64, tf32 and bf16: Tent and ZeroSiam with the JPEG files decoded on the GPU
#             (decode_on_device: the loader's workers only read them), alone and with the captured step
#   graph_equivalence_tent, graph_equivalence_zerosiam
#             the two options against eager on 10,000 CIFAR-10-C images (benchmarks/speed_equivalence.py)
#   vit64     ViT-B/16, batch 64, tf32 and bf16: Tent, ZeroSiam, SAR, DeYO eager; the plain loop;
#             ZeroSiam with channels_last, with compile and with CUDA graphs (compile:reduce-overhead);
#             the profile of ZeroSiam's eager steps
#   resnet64  ResNet-50-GN, the same, ZeroSiam with channels_last, compile+channels_last and compile
#   vit1      ViT-B/16, batch size 1, tf32: Tent and ZeroSiam eager, the plain loop, ZeroSiam compiled
#             with CUDA graphs (compile:reduce-overhead) and without (compile)
#   extra     if time is left: Tent compiled on ViT-B/16 tf32 (ZeroSiam ÷ Tent on the compiled path),
#             benchmarks/guard_cost.py (each guard's step ÷ the unguarded one, ResNet-26-GN, batch 64 and 1),
#             benchmarks/streams.py (batch-1 streams one by one, 15 stacked and 45 stacked: the 15
#             corruptions under three seeds, as `bench --stack` runs them), then
#             benchmarks/speed_equivalence.py on the GPU (ResNet-26-GN, 10,000 CIFAR-10-C images)
#
# Measured on one H200 (2026-11-29, deadline 500 s): vit64 137 s, resnet64 280 s (its 6 compiled rows),
# vit1 stopped by the deadline after its eager rows and one compiled row; the GPU was idle in 72 of 99
# readings of nvidia-smi (compiling, building models, counting FLOPs, starting loaders). The eager rows
# are 2-4 s each; a compiled row costs about 35 s of compilation first (inferred from the two steps'
# durations). With the default 420 s the first two steps end; the rest needs a second call (or a later
# deadline). The two scripts at the end read the project's CIFAR-10 test JPEGs: where ../shared is not
# beside the checkout, carry cifar10-jpeg/cifar10-jpeg-test.tar.gz and point ZEROSIAM_MIRROR at its folder.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-.}
deadline=$(( $(date +%s) + ${1:-420} ))
out=${OUT:-runs/gpu_speed}
device=${DEVICE:-cuda}
vit=${VIT:-vit_base_patch16_224}
resnet=${RESNET:-resnet50_gn}
images=${IMAGES:-2560}
folder=${FOLDER:-/tmp/gpu_speed_folder}  # written once, read by every step
mkdir -p "$out"
left() { echo $(( deadline - $(date +%s) )); }
steps=" ${STEPS:-graph64 graph1 attention64 bf16w64 decode64 graph_equivalence_tent graph_equivalence_zerosiam vit64 resnet64 vit1 vit64_tent guard_cost streams equivalence} "
wanted() { [[ $steps == *" $1 "* ]]; }  # wanted NAME: whether STEPS names this step

step() {  # step NAME ARGS...: gpu_check.py with ARGS, its files under $out/NAME, within the deadline
  local name=$1 start rc; shift
  wanted "$name" || return 0
  if (( $(left) < 30 )); then echo "$name: skipped, deadline" | tee -a "$out/steps.txt"; return; fi
  start=$(date +%s)
  timeout -s TERM -k 10 "$(left)" python benchmarks/gpu_check.py --device "$device" --folder "$folder" \
    --out "$out/$name" "$@" > "$out/$name.log" 2>&1; rc=$?
  echo "$name: exit $rc after $(( $(date +%s) - start )) s" | tee -a "$out/steps.txt"
}

extra() {  # extra NAME NEEDS KEEP LOG SCRIPT ARGS...: SCRIPT if NEEDS s are left, stopped KEEP s before the deadline
  local name=$1 needs=$2 keep=$3 log=$4; shift 4
  wanted "$name" || return 0
  if (( $(left) > needs )); then
    timeout -s TERM -k 10 "$(( $(left) - keep ))" python "$@" > "$out/$log" 2>&1
    echo "$name: exit $?" | tee -a "$out/steps.txt"
  else
    echo "$name: skipped, deadline" | tee -a "$out/steps.txt"
  fi
}

python -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(),
      torch.cuda.get_device_name() if torch.cuda.is_available() else '')" | tee "$out/steps.txt"
smi=  # the GPU's utilisation, memory and clock every 5 s, beside the steps
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=utilization.gpu,memory.used,clocks.sm --format=csv -l 5 > "$out/gpu.csv" 2>&1 &
  smi=$!
fi

graph_options=${GRAPH_OPTIONS:-fixed_shape,graph}  # a CPU try: GRAPH_OPTIONS=fixed_shape (graph needs CUDA)
step graph64 --models "$vit" --precisions tf32,bf16 --batch-size 64 --images "$images" \
  --methods tent,zerosiam,sar --options "$graph_options" --option-methods tent,zerosiam,sar
step graph1 --models "$vit" --precisions tf32 --batch-size 1 --images "${IMAGES_BS1:-256}" \
  --methods tent,zerosiam,sar --options "$graph_options" --option-methods tent,zerosiam,sar
step attention64 --models "$vit" --precisions tf32 --batch-size 64 --images "$images" \
  --methods tent,zerosiam --options "${ATTENTION_OPTIONS:-attention:math,attention:cudnn,attention:math+graph}" \
  --option-methods tent,zerosiam
step bf16w64 --models "$vit" --precisions bf16 --batch-size 64 --images "$images" \
  --methods tent,zerosiam --options "${BF16W_OPTIONS:-frozen_bf16,frozen_bf16+graph}" --option-methods tent,zerosiam
step decode64 --models "$vit" --precisions tf32,bf16 --batch-size 64 --images "$images" \
  --methods tent,zerosiam --options "${DECODE_OPTIONS:-decode_on_device,decode_on_device+graph}" \
  --option-methods tent,zerosiam
for method in tent zerosiam; do  # the captured step against the eager one: 10,000 real images, ResNet-26-GN
  extra "graph_equivalence_$method" 300 240 "graph_equivalence_$method.log" benchmarks/speed_equivalence.py \
    --device "$device" --method "$method" --options "$graph_options"
done
step vit64 --models "$vit" --precisions tf32,bf16 --batch-size 64 --images "$images" \
  --methods tent,zerosiam,sar,deyo --options channels_last,compile,compile:reduce-overhead \
  --option-methods zerosiam --profile
step resnet64 --models "$resnet" --precisions tf32,bf16 --batch-size 64 --images "$images" \
  --methods tent,zerosiam,sar,deyo --options channels_last,compile+channels_last,compile \
  --option-methods zerosiam --profile
step vit1 --models "$vit" --precisions tf32 --batch-size 1 --images "${IMAGES_BS1:-256}" \
  --methods tent,zerosiam --options compile:reduce-overhead,compile --option-methods zerosiam
step vit64_tent --models "$vit" --precisions tf32 --batch-size 64 --images "$images" \
  --methods tent --options compile --option-methods tent
# the guards' cost on the GPU (ratios to the unguarded step, beside it), leaving a minute for the equivalence
extra guard_cost 90 60 guard_cost.md benchmarks/guard_cost.py --device "$device" --repeats 3
extra streams 120 60 streams.md benchmarks/streams.py --device "$device" --model resnet26_gn \
  --methods noadapt,tent,zerosiam --steps 100 --repeats 3 --limit 200
extra equivalence 60 0 equivalence.log benchmarks/speed_equivalence.py --device "$device" \
  --options channels_last,compile

[[ -n $smi ]] && kill "$smi"
cat "$out"/*/gpu_check.md > "$out/tables.md" 2> /dev/null
ls -la "$out" "$out"/*/
