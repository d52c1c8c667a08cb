#!/usr/bin/env bash
# cuda-toolchain.sh [PREFIX] - a CUDA 13.0 build toolchain for machines without a GPU, from PyPI.
# For nvcc on kernels/*.cu and `cargo build/test --features cuda` (candle-core 0.11, cudarc 0.19).
#
#   eval "$(scripts/cuda-toolchain.sh)"   # first run installs (~270 MB), later runs only print
#
# Installs nvcc, cicc, ptxas, the CUDA headers and libcudart into PREFIX/nvidia/cu13
# (default prefix: $HOME/.cache/cuda-toolchain), and builds link stubs for libcuda, libcublas,
# libcublasLt, libcurand and libnvrtc whose every function returns an error (34,
# CUDA_ERROR_STUB_LIBRARY): binaries link and start here, and Device::new_cuda(0) returns Err.
# CUDA 13.0 on purpose: H100/H200 machines with driver 580 (CUDA 13.0) are the target;
# a newer nvcc writes newer PTX (13.4: ISA 9.4) than that driver knows. cudarc 0.19.10 rejects 13.5.
# Keep lib/stubs off LD_LIBRARY_PATH on a machine that has a GPU: they would shadow the real libcuda.
set -euo pipefail

PREFIX=${1:-${CUDA_TOOLCHAIN_PREFIX:-$HOME/.cache/cuda-toolchain}}
CUDARC_VERSION=${CUDARC_VERSION:-0.19.10}   # the stubs export the symbols of this cudarc's bindings
PKGS=(nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88
      nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85)
CUDA=$PREFIX/nvidia/cu13
STAMP=$PREFIX/.done-$(echo "${PKGS[*]} $CUDARC_VERSION" | md5sum | cut -c1-12)

if [[ ! -e $STAMP ]]; then
  {
    # Each wheel unpacks into one CUDA-like tree: $CUDA/{bin,include,lib,nvvm}.
    python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-cache-dir --upgrade --target "$PREFIX" "${PKGS[@]}"
    "$CUDA/bin/nvcc" --version | grep 'release 13.0'
    ln -sf libcudart.so.13 "$CUDA/lib/libcudart.so"   # wheels carry no unversioned .so links

    # Link stubs. Symbol names come from cudarc's bindings (its source, fetched from crates.io).
    tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
    mkdir "$tmp/src" && touch "$tmp/src/lib.rs"
    printf '[package]\nname = "stubs"\nversion = "0.0.0"\nedition = "2021"\n[dependencies]\ncudarc = { version = "=%s", default-features = false }\n' \
      "$CUDARC_VERSION" > "$tmp/Cargo.toml"
    cargo fetch -q --manifest-path "$tmp/Cargo.toml"
    src=$(cargo metadata -q --format-version 1 --manifest-path "$tmp/Cargo.toml" | python3 -c \
      'import json,sys,os; print(next(os.path.dirname(p["manifest_path"]) for p in json.load(sys.stdin)["packages"] if p["name"] == "cudarc"))')
    mkdir -p "$CUDA/lib/stubs"
    for spec in driver:cuda:1:cu cublas:cublas:13:cublas cublaslt:cublasLt:13:cublasLt curand:curand:10:curand nvrtc:nvrtc:13:nvrtc; do
      IFS=: read -r module lib soversion prefix <<< "$spec"
      grep -hoP "^\s+fn \K$prefix\w+(?=\()" "$src/src/$module/sys/mod.rs" | sort -u | awk '
        /^(nvrtc|cublas).*Get(Error|Status)(String|Name)$/ { print "const char *" $1 "(void) { return \"CUDA stub\"; }"; next }
        { print "int " $1 "(void) { return 34; }" }' > "$tmp/$lib.c"
      cc -shared -fPIC -Wl,-soname,"lib$lib.so.$soversion" -o "$CUDA/lib/stubs/lib$lib.so.$soversion" "$tmp/$lib.c"
      ln -sf "lib$lib.so.$soversion" "$CUDA/lib/stubs/lib$lib.so"
    done
    touch "$STAMP"
  } >&2
fi

cat <<EXPORTS
export PATH="$CUDA/bin:\$PATH"
export CUDA_ROOT="$CUDA"
export CUDA_COMPUTE_CAP="\${CUDA_COMPUTE_CAP:-80}"
export LD_LIBRARY_PATH="$CUDA/lib:$CUDA/lib/stubs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
EXPORTS
