#!/usr/bin/env bash
# cuda-device-run.sh - on a GPU machine, from what scripts/cuda-device-pack.sh put beside this
# script: the GPU tests (cuda_ops: every op CPU vs GPU bit for bit; device: training and ptq
# on the GPU), the CUDA benches, and one epoch of LeNet-5 on the full Fashion-MNIST on the GPU
# and the CPU. Needs the NVIDIA driver and the CUDA 13 libraries (libcublas, libcurand;
# searched for when the loader does not find them), not Rust. The log goes to stdout and to
# $OUT/log.txt (OUT defaults to the current directory). BUDGET (seconds, default 400) bounds
# the whole run: each step gets what is left of it.
set -u
START=$(date +%s)
BUDGET=${BUDGET:-400}
OUT=${OUT:-$PWD}
HERE=$(cd "$(dirname "$0")" && pwd)
W=${WORK:-/tmp/qcandle-gpu}
mkdir -p "$W"
exec > >(tee "$OUT/log.txt") 2>&1

# step LIMIT CMD...: CMD under `timeout`, within what is left of BUDGET.
step() {
    local limit=$1 left
    shift
    left=$((BUDGET - ($(date +%s) - START)))
    [ "$limit" -gt "$left" ] && limit=$left
    if [ "$limit" -lt 5 ]; then
        echo "-- skipped (out of time): $*"
        return
    fi
    local t0
    t0=$(date +%s%N)
    echo "== [$(($(date +%s) - START)) s] $* (limit $limit s)"
    timeout "$limit" "$@"
    echo "-- rc $?, $(((($(date +%s%N) - t0)) / 1000000)) ms"
}

date
nproc
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
tar xJf "$HERE/gpubin.tar.xz" -C "$W" 2>/dev/null ||
    python3 -c "import tarfile, sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" \
        "$HERE/gpubin.tar.xz" "$W"
if ldd "$W/cuda_ops" | grep -q 'not found'; then
    dirs=$(timeout 60 find / -xdev \( -name 'libcublas.so.13*' -o -name 'libcublasLt.so.13*' \
        -o -name 'libcurand.so.10*' -o -name 'libcudart.so.13*' \) 2>/dev/null |
        xargs -r -n1 dirname | sort -u | tr '\n' ':')
    export LD_LIBRARY_PATH="${dirs}${LD_LIBRARY_PATH:-}"
fi
if ldd "$W/cuda_ops" | grep -q 'libcudart.so.13 => not found'; then
    cp "$HERE/libcudart.so.13" "$W/"
    export LD_LIBRARY_PATH="$W:${LD_LIBRARY_PATH:-}"
fi
ldd "$W/cuda_ops" | grep -E 'cuda|cublas|curand|not found'
# tests/device.rs runs the CLI from the path it was built at (recorded by the pack script).
if [ -f "$HERE/qcandle-path" ]; then
    bin=$(cat "$HERE/qcandle-path")
    mkdir -p "$(dirname "$bin")" 2>/dev/null && ln -sf "$W/qcandle" "$bin"
fi

cd "$W"
# Without a working GPU the tests print "skipped: no CUDA device" and pass.
step 200 ./cuda_ops --nocapture --test-threads 2
step 60 ./device --nocapture --test-threads 2
step 30 ./gemm_cuda
step 90 ./quantize_cuda
if [ -d "$HERE/fmnist" ]; then
    for run in "float32 cuda" "posit16 cuda" "fp8 cuda" "float32 cpu" "posit16 cpu"; do
        set -- $run
        step 60 ./qcandle train --model lenet5 --data fashion-mnist --data-dir "$HERE/fmnist" \
            --epochs 2 --quiet --device "$2" --config "$1" --out "$W/runs/$1-$2"
        cat "$W/runs/$1-$2/metrics.csv" 2>/dev/null
        echo
    done
fi
echo "== done after $(($(date +%s) - START)) s"
