#!/usr/bin/env bash
# cuda-device-pack.sh [DIR] - build the CUDA test and bench executables here (no GPU needed) and
# pack them for a GPU machine without Rust: DIR (default target/gpu-carry) receives
# gpubin.tar.xz (cuda_ops, device, quantize_cuda, gemm_cuda, qcandle; stripped, ~20 MB: the
# candle kernels' PTX in each binary is shared by the compressor's 96 MiB window),
# libcudart.so.13 from the toolchain (used only if the GPU machine lacks it), the full
# Fashion-MNIST when /usr/share/datasets/fashion-mnist has it, and cuda-device-run.sh.
# Then run `bash DIR/cuda-device-run.sh` on the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-target/gpu-carry}
mkdir -p "$DIR"
eval "$(bash scripts/cuda-toolchain.sh)"
json=$(mktemp)
cargo test --release --features cuda --no-run --message-format=json >"$json"
cargo bench --features cuda --no-run --message-format=json >>"$json"
stage=$(mktemp -d)
python3 - "$json" "$stage" <<'PY'
import json, shutil, subprocess, sys
want = {("cuda_ops", "test"), ("device", "test"), ("quantize_cuda", "bench"),
        ("gemm_cuda", "bench"), ("qcandle", "bin")}
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        key = (m["target"]["name"], m["target"]["kind"][0])
        if key in want:
            subprocess.run(["strip", "-o", f"{sys.argv[2]}/{key[0]}", m["executable"]], check=True)
            want.discard(key)
if want:
    sys.exit(f"not built: {sorted(want)}")
PY
tar cf - -C "$stage" cuda_ops device quantize_cuda gemm_cuda qcandle |
    xz --lzma2=preset=6,dict=96MiB -T2 >"$DIR/gpubin.tar.xz"
cp "$CUDA_ROOT/lib/libcudart.so.13" "$DIR/"
if [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    mkdir -p "$DIR/fmnist"
    cp /usr/share/datasets/fashion-mnist/*.gz "$DIR/fmnist/"
fi
cp scripts/cuda-device-run.sh "$DIR/"
echo "$PWD/target/release/qcandle" >"$DIR/qcandle-path"
rm -rf "$stage" "$json"
du -sh "$DIR"
