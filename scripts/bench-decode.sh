#!/usr/bin/env bash
# Decode speed of hypura next to a plain llama.cpp loop on the same file, in
# the same run, with the same llama.cpp build (the static libraries cargo built
# from llama-cpp-sys-2's vendored sources) and the same threads.
#
#   scripts/bench-decode.sh [MODEL] [N_TOKENS] [RUNS]
#
# Prints one line per run and the median ratio hypura / llama.cpp.
# HYPURA_ARGS adds flags to hypura (e.g. --repack, which llama.cpp does by default).
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
n="${2:-128}"
runs="${3:-5}"
threads="${THREADS:-$(nproc)}"
prompt="The history of the city of Paris begins"

bench=target/release/llama-decode-bench
# SKIP_BUILD=1 uses binaries built elsewhere (e.g. carried to a machine without Rust).
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  cargo build --release -q -p hypura
  out=$(ls -td target/release/build/llama-cpp-sys-2-*/out/lib | head -1)
  src=$(ls -d ~/.cargo/registry/src/*/llama-cpp-sys-2-0.1.161/llama.cpp | head -1)
  libs=$(find "$out" -name 'libllama.a' -o -name 'libggml*.a' | sort -r | tr '\n' ' ')
  cc -O2 -o "$bench" scripts/bench/llama_decode_bench.c -I"$src/include" -I"$src/ggml/include" \
    -Wl,--start-group $libs -Wl,--end-group -lstdc++ -lgomp -lm -lpthread
fi

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
h_all=(); l_all=()
for i in $(seq "$runs"); do
  h=$(target/release/hypura run "$model" ${HYPURA_ARGS:-} --raw --prompt "$prompt" --temperature 0 --max-tokens "$n" \
        --threads "$threads" --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["stats"]["tokens_per_second"])')
  l=$("$bench" "$model" "$prompt" "$n" "$threads" | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens_per_second"])')
  echo "run $i: hypura $h tok/s, llama.cpp $l tok/s"
  h_all+=("$h"); l_all+=("$l")
done
hm=$(printf '%s\n' "${h_all[@]}" | median)
lm=$(printf '%s\n' "${l_all[@]}" | median)
echo "median decode: hypura $hm tok/s, llama.cpp $lm tok/s, ratio $(python3 -c "print(round($hm/$lm, 3))") ($(basename "$model"), $n tokens, $threads threads)"
