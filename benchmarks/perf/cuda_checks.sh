#!/usr/bin/env bash
# The GPU checks in one run, for a machine with one CUDA device (the CI machine has none):
#   1. the CUDA tests (every test whose name or marker says cuda or device; tests/test_cuda.py fits every
#      estimator family on the GPU in float32 and float64 and compares it with the CPU fit);
#   2. step times of flowgp's SVGP and TGP against GPyTorch's SVGP on the same GPU, M = 100, 500, 1000,
#      B = 1024 and 8192, float32 and float64 (benchmarks/perf/step_time.py --device "$dev");
#   3. step times of flowgp's DSVI deep GP (and the cnf flow posterior) against GPyTorch's DeepGP, same grid
#      (benchmarks/perf/dgp_step_time.py --device "$dev");
#   4. a profile of the eager SVGP/TGP step on the GPU: launches, syncs and the lines that synchronise;
#   5. the compiled SVGP/TGP and 3-layer DSVI steps on the GPU (float32, M = 100, B = 1024) with CUDA graphs
#      (reduce-overhead) and with the default mode, compilation time apart;
#   ldgp (not in the default set): latent-DGP reference fits on the authors' splits, started in the
#      background at the beginning, one process per job (LDGP_JOBS="model:dataset:split ...", each capped at
#      LDGP_SECONDS of fitting and 589 epochs), rows gathered into OUTDIR/ldgp_rows.jsonl when the other phases end.
#      Needs FLOWGP_DATA with the data sets. They share the GPU with the other phases: time those apart.
# Usage:  bash benchmarks/perf/cuda_checks.sh OUTDIR [PHASES]   (it runs the scripts from the repository root)
# PHASES is a subset of "tests step dgp profile compile" (default: all). Each phase has its own time limit, so one
# that hangs does not take the others with it; results land in OUTDIR as they are made (log.txt, *.json).
set -u
out=${1:?usage: cuda_checks.sh OUTDIR [PHASES]}
phases=${2:-"tests step dgp profile compile"}
mkdir -p "$out" && out=$(cd "$out" && pwd)  # absolute: the script runs from the repository root
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"  # the scripts run as modules of the benchmarks package
export PYTHONPATH="$root/src:$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
dev=${DEVICE:-cuda}  # DEVICE=cpu for a dry run of the script itself
stamp() { echo "=== $(date -u +%H:%M:%S) $*"; }

stamp env
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1
$py -c "import torch, numpy, sklearn; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'device', torch.cuda.get_device_name(0), 'numpy', numpy.__version__, 'sklearn', sklearn.__version__)"
$py -c "import gpytorch; print('gpytorch', gpytorch.__version__)" 2>&1
nproc

ldgp_pids=""
if [[ " $phases " == *" ldgp "* ]]; then
  stamp "ldgp: ${LDGP_JOBS:?set LDGP_JOBS} (background, ${LDGP_SECONDS:=300} s each)"
  for job in $LDGP_JOBS; do
    IFS=: read -r model dataset split <<< "$job"
    timeout $((LDGP_SECONDS + 240)) $py -m benchmarks.studies.ldgp_gpu_fit --device "$dev" --model "$model" \
      --dataset "$dataset" --split "$split" --seconds "$LDGP_SECONDS" --max-epochs 589 \
      > "$out/ldgp_$model-$dataset-$split.log" 2>&1 &
    ldgp_pids="$ldgp_pids $!"
  done
fi

for phase in $phases; do
  case $phase in
    ldgp) ;;  # started above
    tests)
      stamp "tests: pytest -k 'cuda or device'"
      timeout 200 $py -m pytest -q -rfEs --tb=short -p no:cacheprovider -o addopts="--import-mode=importlib" -k "cuda or device" \
        "$root/tests" 2>&1 | grep -v "Warning\|warnings.warn\|^  \|^$" | tail -80
      ;;
    step)
      for b in 1024 8192; do
        stamp "step_time B=$b"
        timeout 90 $py -m benchmarks.perf.step_time --device "$dev" --num-data 100000 --inducing 100,500,1000 \
          --batch "$b" --dtypes float32,float64 --repeats 60 --warmup 10 --json "$out/step_time_cuda_b$b.json"
      done
      ;;
    dgp)
      for m in 100 500 1000; do
        for b in 1024 8192; do
          stamp "dgp_step_time M=$m B=$b"
          timeout 70 $py -m benchmarks.perf.dgp_step_time --device "$dev" --no-energy --dtypes float32,float64 \
            --num-data 100000 --inducing "$m" --batch "$b" --models dgp,cnf-dgp --rounds 5 --steps 10 \
            --warmup 3 --note "cuda_checks.sh" --json "$out/dgp_step_time_cuda_m${m}_b$b.json" 2>&1 | grep -v "^wrote"
        done
      done
      ;;
    profile)
      stamp "cuda_step_profile (float32, M=100, B=1024)"
      timeout 60 $py -m benchmarks.perf.cuda_step_profile --device "$dev" --inducing 100 --batch 1024 2>&1 \
        | grep -v "USDT"
      ;;
    compile)
      for mode in reduce-overhead default; do
        stamp "step_time --compile --compile-mode $mode (float32, M=100, B=1024)"
        timeout 110 $py -m benchmarks.perf.step_time --device "$dev" --num-data 100000 --inducing 100 \
          --batch 1024 --dtypes float32 --repeats 60 --warmup 10 --compile --compile-mode "$mode" \
          --json "$out/step_time_cuda_compiled_$mode.json" 2>&1 | grep -v "Warning\|warn\|check("
        stamp "dgp_step_time --compile --compile-mode $mode (float32, M=100, B=1024, 3 layers)"
        timeout 110 $py -m benchmarks.perf.dgp_step_time --device "$dev" --no-energy --dtypes float32 \
          --num-data 100000 --inducing 100 --batch 1024 --layers 3 --models dgp,cnf-dgp --rounds 3 --steps 10 \
          --compile --compile-mode "$mode" --json "$out/dgp_step_time_cuda_compiled_$mode.json" 2>&1 \
          | grep -v "Warning\|warn\|check(\|^wrote"
      done
      ;;
    *) echo "unknown phase $phase" ;;
  esac
done
if [ -n "$ldgp_pids" ]; then
  stamp "ldgp: waiting for$ldgp_pids"
  wait $ldgp_pids
  for f in "$out"/ldgp_*.log; do echo "--- $f"; grep -v "^{" "$f" | tail -5; done
  cat "$out"/ldgp_*.log | grep "^{" > "$out/ldgp_rows.jsonl"
  cat "$out/ldgp_rows.jsonl"
  rm -f "$out"/ldgp_*.log
fi
stamp done
