#!/usr/bin/env bash
# Installs the build into a scratch prefix, then builds and runs a consumer
# through find_package(braid) and through pkg-config.
set -euo pipefail
build=$1
source=$(cd "$(dirname "$0")" && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

cmake --install "$build" --prefix "$scratch/prefix" >/dev/null
cmake -S "$source" -B "$scratch/cmake" -DCMAKE_PREFIX_PATH="$scratch/prefix" >/dev/null
cmake --build "$scratch/cmake" >/dev/null
LD_LIBRARY_PATH="$scratch/prefix/lib" "$scratch/cmake/consumer"

export PKG_CONFIG_PATH="$scratch/prefix/lib/pkgconfig"
c++ -std=c++17 "$source/consumer.cc" -o "$scratch/consumer-pc" $(pkg-config --cflags --libs braid)
LD_LIBRARY_PATH="$scratch/prefix/lib" "$scratch/consumer-pc"
echo "find_package(braid) and pkg-config braid both work"
