#!/usr/bin/env bash
# Runs kiln's GPU checks on a machine with an NVIDIA GPU, torch (CUDA), g++ and python3, without
# Bazel: the kiln client is installed into /tmp/site, kilnd comes from a bundle (deploy/bundle.sh),
# NVRTC from the CUDA toolkit or torch's nvidia wheels. Each step's output goes to stdout and, when
# $OUT is set, to $OUT/<step>.log.
#
#   tests/gpu/run_on_gpu.sh [--bundle DIR] STEP...
#   steps: info      GPU, driver, torch, NVRTC found
#          backend   pytest tests/gpu/test_cuda_backend.py (torch.compile(backend="kiln") on CUDA)
#          corpus    the correctness corpus on CUDA (KILN_CORPUS_DEVICE=cuda tests/python/test_corpus.py)
#          models    tests/gpu/models_check.py (GPT block, ResNet-18/50, BERT layer, Llama block; fp32/bf16;
#                    train/infer)
#          kernels   tests/gpu/cuda_kernels_check.py --cubins build/cuda_fixtures (emit_cuda_fixtures output)
#          bench     scripts/bench_gpu.py (kernels, model steps, cold/warm compile: kiln vs eager vs Inductor)
#          dynamic   scripts/bench_dynamic.py (a GPT block whose sequence length changes: compile cost
#                    per new length and steady step times, kiln vs eager vs Inductor)
#          precompile tests/gpu/precompile_check.py (kiln.precompile with CUDA hidden fills the cache
#                    that a GPU process then hits)
#          profile   tests/gpu/profile_model.py (one model step's GPU kernels and host time, eager vs
#                    Inductor vs kiln; default ResNet-18 inference)
#          hostsplit tests/gpu/host_split.py (a training step's host time: forward call, backward,
#                    optimizer, kiln's guard and CUDA-graph runner; Inductor vs kiln)
#          softmax   tests/gpu/softmax_shapes.py (row softmaxes over vocabulary rows and sliced
#                    inputs through torch.compile: kiln vs eager vs Inductor)
# Extra arguments for one step: STEP_ARGS_<STEP> (e.g. STEP_ARGS_models="--only resnet50").
# Exit status: the number of failed steps (0: all passed).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
bundle=.bundle/kiln
if [ "${1:-}" = "--bundle" ]; then bundle="$2"; shift 2; fi
export KILND="$PWD/$bundle/kilnd"
[ -x "$KILND" ] || { echo "run_on_gpu: no kilnd at $KILND (build one with deploy/bundle.sh)"; exit 100; }

if [ -z "${KILN_NVRTC_PATH:-}" ]; then
  for f in /usr/local/cuda/lib64/libnvrtc.so.13 /usr/local/cuda/lib64/libnvrtc.so.12 /usr/local/cuda/lib64/libnvrtc.so \
           $(python3 -c 'import site,glob;[print(p) for s in site.getsitepackages() for p in sorted(glob.glob(s+"/nvidia/*/lib/libnvrtc.so*"))]' 2>/dev/null); do
    case "$f" in *builtins*|*alt*) continue ;; esac
    [ -f "$f" ] && { export KILN_NVRTC_PATH="$f"; break; }
  done
fi
python3 -m pip install -q --upgrade --no-deps --no-build-isolation --target /tmp/site ./client/python >/tmp/kiln-pip.log 2>&1 \
  || { cat /tmp/kiln-pip.log; echo "run_on_gpu: installing the client failed"; exit 100; }
export PYTHONPATH=/tmp/site:$PWD/tests/python
export KILN_CACHE_DIR="${KILN_CACHE_DIR:-/tmp/kiln-gpu-cache}"

failed=0
run_step() {
  local name="$1"; shift
  local log=/dev/null
  [ -n "${OUT:-}" ] && log="$OUT/$name.log"
  echo "===== $name: $* ====="
  local start=$SECONDS
  "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  echo "===== $name: exit $rc in $((SECONDS - start)) s ====="
  [ "$rc" -eq 0 ] || failed=$((failed + 1))
}

for step in "$@"; do
  extra_var="STEP_ARGS_$step"
  read -r -a extra <<<"${!extra_var:-}"
  case "$step" in
    info)
      run_step info bash -c 'nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv;
        python3 -c "import torch,sys,grpc,google.protobuf as p;print(\"python\",sys.version.split()[0],\"torch\",torch.__version__,\"cuda\",torch.version.cuda,\"grpcio\",grpc.__version__,\"protobuf\",p.__version__)";
        python3 -c "import triton;print(\"triton\",triton.__version__)"; echo "NVRTC: ${KILN_NVRTC_PATH:-not found}";
        "$KILND" --version' ;;
    backend) run_step backend python3 -m pytest -q -p no:cacheprovider tests/gpu/test_cuda_backend.py "${extra[@]}" ;;
    corpus) run_step corpus env KILN_CORPUS_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
              tests/python/test_corpus.py -k "test_graph and not compiles_for_cuda" "${extra[@]}" ;;
    models) run_step models python3 tests/gpu/models_check.py --kilnd "$KILND" "${extra[@]}" ;;
    kernels) run_step kernels python3 tests/gpu/cuda_kernels_check.py --cubins build/cuda_fixtures "${extra[@]}" ;;
    precompile) run_step precompile python3 tests/gpu/precompile_check.py --kilnd "$KILND" "${extra[@]}" ;;
    profile) run_step profile python3 tests/gpu/profile_model.py --kilnd "$KILND" "${extra[@]}" ;;
    hostsplit) run_step hostsplit python3 tests/gpu/host_split.py --kilnd "$KILND" "${extra[@]}" ;;
    softmax) run_step softmax python3 tests/gpu/softmax_shapes.py --kilnd "$KILND" "${extra[@]}" ;;
    bench) run_step bench python3 scripts/bench_gpu.py --kilnd "$KILND" "${extra[@]}" ;;
    dynamic) run_step dynamic python3 scripts/bench_dynamic.py --kilnd "$KILND" "${extra[@]}" ;;
    *) echo "run_on_gpu: unknown step $step"; failed=$((failed + 1)) ;;
  esac
done
exit "$failed"
