#!/usr/bin/env bash
# tools/gpu_bundle.sh: .gpu-deps/, what a GPU machine that has CUDA and torch
# but not Debian's development packages needs to build braid's tests and
# benchmarks there: GoogleTest (static), Google Benchmark (its shared
# library) and their CMake packages, copied from this machine's Debian
# packages (libgtest-dev, libgmock-dev, libbenchmark-dev) with their layout
# under /usr kept, so that each package's own files find its libraries.
#
#   tools/gpu_bundle.sh            makes .gpu-deps/ (ignored by git; ~3 MiB)
#
# tools/gpu_check.sh configures with GTest_DIR and benchmark_DIR pointing
# into .gpu-deps/ where it exists and the machine has no package of its own.
# The libraries are x86-64, built by g++ 12 against glibc 2.36: a machine
# with the same or a newer compiler and C library links them.
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=.gpu-deps
packages=(libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian)

for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2> /dev/null | grep -q "install ok installed"; then
    echo "gpu_bundle: $p is not installed (scripts/install-deps.sh installs it)" >&2
    exit 1
  fi
done

rm -rf "$bundle"
mkdir -p "$bundle"
# Headers, libraries and CMake packages: what a build links; not the
# sources, documents or pkg-config files.
dpkg -L "${packages[@]}" | sort -u | while read -r path; do
  case $path in
    /usr/include/* | /usr/lib/*) ;;
    *) continue ;;
  esac
  case $path in */pkgconfig | */pkgconfig/*) continue ;; esac
  if [ -L "$path" ] || [ -f "$path" ]; then
    mkdir -p "$bundle$(dirname "$path")"
    cp -P "$path" "$bundle$path"
  fi
done

multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2> /dev/null || echo x86_64-linux-gnu)
for package in GTest benchmark; do
  [ -f "$bundle/usr/lib/$multiarch/cmake/$package/${package}Config.cmake" ] || {
    echo "gpu_bundle: no CMake package for $package under $bundle/usr/lib/$multiarch/cmake" >&2
    exit 1
  }
done
echo "gpu_bundle: $bundle/ holds $(find "$bundle" -type f | wc -l) files," \
  "$(du -sh "$bundle" | cut -f1): carry it to the GPU machine beside the tree"
