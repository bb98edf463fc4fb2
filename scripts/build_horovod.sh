#!/usr/bin/env bash
# Build Horovod 0.28.1 (its last release) from source against the torch already installed, for
# `rpcctl bench --transport horovod`. Reproducible: a pinned, checksummed sdist and fixed flags.
#
#   scripts/build_horovod.sh [PYTHON]      # default: .venv/bin/python; ~4-8 min on 2 cores
#
# Why a script and not `pip install horovod`: pip's build isolation hides the installed torch
# from Horovod's setup (so it builds without the torch extension, or fails), and Horovod's CMake
# forces C++14 while torch >= 2.1 headers need C++17. So: no build isolation, and
# CMAKE_CXX_STANDARD raised to 17. CPU only: the Gloo controller, no MPI, no TensorFlow/MXNet.
# Needs cmake (>= 3.13) and a C++17 compiler (g++ 9+).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${1:-.venv/bin/python}
VERSION=0.28.1
SHA256=92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0

"$PYTHON" -c 'import torch' 2>/dev/null || { echo "build_horovod: $PYTHON has no torch; install rpcctl first" >&2; exit 2; }
command -v cmake >/dev/null || { echo "build_horovod: cmake is needed (apt-get install cmake)" >&2; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
started=$(date +%s)

# Horovod's own runtime and build requirements, pinned (constraints.txt), installed first since
# the build runs without isolation.
"$PYTHON" -m pip install -q -c constraints.txt cffi cloudpickle pycparser wheel
"$PYTHON" -m pip download -q --no-deps --no-binary :all: "horovod==$VERSION" -d "$work"
echo "$SHA256  $work/horovod-$VERSION.tar.gz" | sha256sum -c --quiet -
tar -xzf "$work/horovod-$VERSION.tar.gz" -C "$work"
src="$work/horovod-$VERSION"
sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
grep -q 'CMAKE_CXX_STANDARD 14' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt" && { echo "build_horovod: C++ standard patch did not apply" >&2; exit 1; }

HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITH_GLOO=1 HOROVOD_CPU_OPERATIONS=gloo \
HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
MAKEFLAGS="-j$(nproc)" \
    "$PYTHON" -m pip install -q --no-build-isolation --no-deps -c constraints.txt "$src"

"$PYTHON" - <<'EOF'
import horovod.torch as hvd
assert hvd.gloo_built(), "horovod was built without Gloo"
print("build_horovod: horovod", __import__("horovod").__version__, "with the torch extension and Gloo")
EOF
echo "build_horovod: done in $(( $(date +%s) - started )) s"
