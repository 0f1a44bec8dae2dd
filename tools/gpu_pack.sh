#!/usr/bin/env bash
# Builds the CUDA binaries on this machine for another host and packs them into .gpu/pack.tar.xz
# (ignored by git), for `tools/gpu_check.sh --prebuilt` on a GPU machine that has the CUDA
# libraries but not the C++ packages (see docs/gpu.md). The CPU code is built for x86-64-v3
# (AVX2, FMA) rather than this CPU, the GPU code for CUDA_ARCH (default 90, the H100/H200).
# The binaries are stripped; the shared libraries they take from the distribution (not CUDA's,
# not the C and C++ run-times) travel beside them. The binaries read data/ from this checkout's
# path, which gpu_check.sh links to the tree it runs in.
#   tools/gpu_pack.sh      # about 10 MB
set -euo pipefail
cd "$(dirname "$0")/.."
ARCH=${CUDA_ARCH:-90}
BUILD=build/gpu-pack
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DINFERLAB_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
  -DINFERLAB_MARCH=x86-64-v3 > /dev/null
cmake --build "$BUILD" -j "$(nproc)"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
cp "$BUILD"/bin/* "$stage/bin/"
strip "$stage"/bin/*
ldd "$stage"/bin/* | awk '/=>/ {print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libcuda* | libcublas* | libc.so* | libm.so* | libstdc++* | libgcc_s* | libdl.so* | libpthread* | librt.so*) ;;
    *) cp -L "$lib" "$stage/lib/" ;;
  esac
done
echo "$PWD" > "$stage/source_dir"
mkdir -p .gpu
git rev-parse --short HEAD > .gpu/commit
tar -cJf .gpu/pack.tar.xz -C "$stage" .
echo "gpu_pack: .gpu/pack.tar.xz holds $(ls "$stage/bin" | wc -l) programs and $(ls "$stage/lib" | tr '\n' ' ')($(du -h .gpu/pack.tar.xz | cut -f1))"
