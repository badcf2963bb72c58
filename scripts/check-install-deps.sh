#!/usr/bin/env bash
# Proves scripts/install-deps.sh installs every prerequisite: bootstraps a bare
# Debian root (debootstrap, minbase + what the README assumes: python3, git),
# runs install-deps.sh in it, then builds with what it installed:
#   default  probes that use each prerequisite as the build does: a CMake C++
#            project built with the Makefile generator, and a C program that
#            parses a header through libclang as bindgen does (<stddef.h> and
#            all); pip itself is exercised by installing the test clients
#   --build  also `cargo build --release -p hypura` inside that root (the
#            host's Rust toolchain bind-mounted read-only; ~15 min on 2 cores)
#   --runtime  instead, the Dockerfile's runtime stage without Docker (no engine
#            or image registry here): only the packages its last stage installs,
#            then the built target/release/hypura serves models/SmolLM2 there
#            and must answer /api/generate (scripts/check-runtime.py)
# Fails when a prerequisite is missing from install-deps.sh. Needs root (or
# sudo) and the Debian mirror; the bootstrapped base is cached as a tarball
# under ${HYPURA_CACHE_DIR:-~/.cache/hypura}, so later runs only reinstall.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
mode="${1:-probe}"
case "$mode" in probe | --build | --runtime) ;; *) echo "usage: $0 [--build|--runtime]" >&2; exit 2 ;; esac

sudo=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "check-install-deps.sh: needs root or sudo" >&2; exit 1; }
  sudo=(sudo)
fi
command -v debootstrap >/dev/null ||
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq debootstrap >/dev/null

suite="${HYPURA_CHECK_SUITE:-bookworm}"
mirror="${HYPURA_CHECK_MIRROR:-http://deb.debian.org/debian}"
cache="${HYPURA_CACHE_DIR:-$HOME/.cache/hypura}"
base="$cache/deps-check-$suite.tar"
mkdir -p "$cache"
root=$(mktemp -d /tmp/hypura-deps-check.XXXXXX)
mounts=()
cleanup() {
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do "${sudo[@]}" umount -l "${mounts[$i]}" 2>/dev/null || true; done
  # Never delete through a mount still in place (the repository, the toolchain).
  if grep -q " $root" /proc/mounts; then
    echo "check-install-deps.sh: $root still has mounts; left in place" >&2
  else
    "${sudo[@]}" rm -rf --one-file-system "$root"
  fi
}
trap cleanup EXIT
trap 'echo "check-install-deps.sh: FAILED (line $LINENO): a prerequisite is missing from scripts/install-deps.sh, or the bare root could not be set up (see above)" >&2' ERR
bind() { # bind SRC DEST [ro]
  "${sudo[@]}" mkdir -p "$root$2"
  "${sudo[@]}" mount --bind "$1" "$root$2"
  mounts+=("$root$2")
  [ "${3:-}" != ro ] || "${sudo[@]}" mount -o remount,bind,ro "$root$2"
}

if [ -f "$base" ]; then
  "${sudo[@]}" tar -xf "$base" -C "$root"
else
  echo "check-install-deps.sh: bootstrapping a bare $suite (cached afterwards in $base)"
  "${sudo[@]}" debootstrap --variant=minbase --include=python3,git "$suite" "$root" "$mirror" >/dev/null
  "${sudo[@]}" tar -cf "$base.tmp" -C "$root" . && mv "$base.tmp" "$base"
fi
"${sudo[@]}" cp /etc/resolv.conf "$root/etc/resolv.conf"
# This machine's local CAs (e.g. a TLS-inspecting proxy's), as a bare machine
# behind the same proxy would have them; ca-certificates picks them up.
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  "${sudo[@]}" mkdir -p "$root/usr/local/share/ca-certificates"
  "${sudo[@]}" cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
fi
for fs in proc sys dev dev/pts; do bind "/$fs" "/$fs"; done
bind "$repo/scripts" /src/scripts ro
bind "$repo/gateway/tests/clients" /src/gateway/tests/clients ro
# A bare machine has a Rust toolchain: the host's, read-only.
bind "${RUSTUP_HOME:-$HOME/.rustup}" /opt/rustup ro
bind "${CARGO_HOME:-$HOME/.cargo}/bin" /opt/cargo/bin ro
in_root() {
  "${sudo[@]}" chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 \
    PATH=/opt/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    RUSTUP_HOME=/opt/rustup CARGO_HOME=/root/.cargo RUSTUP_TOOLCHAIN="$(rustup show active-toolchain 2>/dev/null | cut -d' ' -f1)" \
    DEBIAN_FRONTEND=noninteractive bash -euo pipefail -c "$1"
}

if [ "$mode" = --runtime ]; then
  # The packages of the Dockerfile's last `apt-get install` (its runtime stage).
  runtime_pkgs=$(grep -o 'install -y --no-install-recommends [a-z0-9. +-]*' Dockerfile | tail -1 | cut -d' ' -f4-)
  [ -x target/release/hypura ] && [ -f models/SmolLM2-135M-Instruct.Q4_1.gguf ] || {
    echo "check-install-deps.sh: --runtime needs target/release/hypura and models/ (build and fetch first)" >&2
    exit 1
  }
  echo "check-install-deps.sh: runtime stage: only $runtime_pkgs"
  in_root "apt-get update -qq && apt-get install -y -qq --no-install-recommends $runtime_pkgs >/dev/null"
  bind "$repo/target/release" /opt/hypura ro
  bind "$repo/models" /models ro
  bind "$repo/scripts" /opt/scripts ro
  in_root 'python3 /opt/scripts/check-runtime.py /opt/hypura/hypura /models/SmolLM2-135M-Instruct.Q4_1.gguf'
  echo "check-install-deps.sh: ok, the runtime stage's packages run hypura"
  exit 0
fi

echo "check-install-deps.sh: running install-deps.sh --test in the bare root"
in_root "cd /src && ./scripts/install-deps.sh --test"

echo "check-install-deps.sh: probing each prerequisite"
in_root '
mkdir -p /tmp/probe/cmake && cd /tmp/probe
cat > cmake/CMakeLists.txt <<EOF
cmake_minimum_required(VERSION 3.14)
project(probe C CXX)
add_executable(probe probe.cpp)
EOF
echo "#include <vector>
int main() { std::vector<int> v{1}; return v[0] - 1; }" > cmake/probe.cpp
cmake -S cmake -B cmake/build -G "Unix Makefiles" >/dev/null
cmake --build cmake/build >/dev/null
./cmake/build/probe

# What bindgen does: parse a header through libclang and fail on any error.
llvm=$(ls -d /usr/lib/llvm-* | sort -V | tail -1)
cat > clang.c <<EOF
#include <clang-c/Index.h>
#include <stdio.h>
int main(void) {
  CXIndex index = clang_createIndex(0, 0);
  const char *args[] = {"-x", "c"};
  CXTranslationUnit tu = clang_parseTranslationUnit(index, "h.h", args, 2, 0, 0, 0);
  if (!tu) return 2;
  unsigned n = clang_getNumDiagnostics(tu), errors = 0;
  for (unsigned i = 0; i < n; i++) {
    CXDiagnostic d = clang_getDiagnostic(tu, i);
    if (clang_getDiagnosticSeverity(d) >= CXDiagnostic_Error) {
      CXString s = clang_formatDiagnostic(d, clang_defaultDiagnosticDisplayOptions());
      fprintf(stderr, "libclang: %s\n", clang_getCString(s));
      errors++;
    }
  }
  return errors ? 1 : 0;
}
EOF
printf "#include <stddef.h>\n#include <stdint.h>\n#include <stdbool.h>\nsize_t f(int32_t x, bool b);\n" > h.h
cc clang.c -I"$llvm/include" -L"$llvm/lib" -Wl,-rpath,"$llvm/lib" -lclang -o clang_probe
./clang_probe
python3 -c "import ollama, openai, pytest"
'
if [ "$mode" = --build ]; then
  echo "check-install-deps.sh: building hypura in the bare root"
  bind "$repo" /src/repo ro
  in_root "cd /src/repo && CARGO_TARGET_DIR=/tmp/target cargo build --release -p hypura"
fi
echo "check-install-deps.sh: ok, install-deps.sh covers the prerequisites"
