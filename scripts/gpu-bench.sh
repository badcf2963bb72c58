#!/usr/bin/env bash
# hypura's GPU tier against plain llama.cpp on a CUDA machine without Rust.
#
#   scripts/gpu-bench.sh STEP...     (steps: build models smoke dense moe serve gpudefault profile plan bench summary;
#                                     beside llama.cpp's own tools: tools vsdense vsloop nsysdense batched vsserver cached
#                                     exact bigmodel vsmixtral vsmixprompt qwenmodel vsqwenprompt qwenrecycle routingseed table; pack; the full-size Mixtral shape under
#                                     `hypura serve`'s budget: servemix; host memory inside the RAM budget: hostmem,
#                                     and what a cgroup holds at the peak: hostmemwatch; the engine's GPU tests: gputest)
#
# hypura is built elsewhere with `--features dynamic-link` (llama.cpp as shared
# libraries). Here the same vendored llama.cpp source is built with CUDA as
# shared libraries, and the binary runs over them (same source, same ABI).
# The baseline is scripts/bench/llama_decode_bench.c (a plain llama.cpp greedy
# loop) built against the same libraries: llama-bench's sources are not
# vendored by llama-cpp-sys-2.
#
# Inputs (copied into the ignored .devcarry/ and carried; docs/benchmarks.md
# says how): .devcarry/llama.cpp.tar.gz, .devcarry/hypura, .devcarry/hypura-synth,
# and for `tools` .devcarry/llama-tools.tar.gz (llama-bench and llama-server
# from the llama-cpp-python 0.3.36 sdist, llama.cpp 0c1e57098).
# Outputs under $OUT (at most 8 files): results.jsonl (one line per run),
# log.txt, summary.txt, h200-measured.json (hypura profile), plans.jsonl,
# bench.jsonl (hypura bench: the planner's prediction beside the measurement).
# Runs are skipped once the call has run DEADLINE seconds (default 560), so a
# call under the device's 600 s limit still returns its results; a later call
# with the remaining steps reuses the build and models while the machine is warm.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-bench-out}
W=${GPU_WORK:-/tmp/hypura-gpu}
T=${THREADS:-$(nproc)}
# HB_THREADS: `hypura bench`'s threads alone (default $T), for an A/B of
# hypura's thread count beside an unchanged llama-bench (session 32: with
# every core computing, Qwen3's streamed decode had steps 3-6x slower
# outside read stalls).
HT=${HB_THREADS:-$T}
N=${N_TOKENS:-64}
R=${RUNS:-3}
PROMPT="The history of the city of Paris begins"
SRC=$W/llama.cpp
B=$W/build/bin
H=$PWD/.devcarry/hypura
# Carried xz-compressed where the device tool's size limit is tight.
[ -x "$H" ] || { [ -f "$H.xz" ] && xz -dc "$H.xz" >"$H" && chmod +x "$H"; }
S=$PWD/.devcarry/hypura-synth
[ -x "$S" ] || { [ -f "$S.xz" ] && xz -dc "$S.xz" >"$S" && chmod +x "$S"; }
LB=$W/llama-decode-bench
DENSE=$W/llama-8b-q4k.gguf
MOE=$W/mixtral-8l-q4k.gguf
MOEFULL=$W/mixtral-8x7b-q4k.gguf
export LD_LIBRARY_PATH=$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$OUT" "$W"
DEADLINE=${DEADLINE:-560}
# shellcheck source=scripts/bench/profile_now.sh
. scripts/bench/profile_now.sh
log() { echo "== $(date +%T) [${SECONDS}s] $*" | tee -a "$OUT/log.txt"; }
late() { [ "$SECONDS" -ge "$DEADLINE" ] && { log "skipped (deadline): $*"; return 0; }; return 1; }

build() {
  if [ -f "$B/libllama.so" ] && [ -x "$LB" ]; then log "build: already there"; return; fi
  if ls .devcarry/cuda-build.tar.xz.* >/dev/null 2>&1; then unpack && return; fi
  log "build: llama.cpp (vendored by llama-cpp-sys-2 0.1.161) with CUDA, shared"
  rm -rf "$SRC" && tar xzf .devcarry/llama.cpp.tar.gz -C "$W" || return 1
  # The options llama-cpp-sys-2's build.rs passes for our release build
  # (dynamic-link, openmp, common, target-cpu=x86-64-v3), plus CUDA for sm_90.
  local flags="-march=x86-64-v3 -ffunction-sections -fdata-sections -fPIC -m64 -w"
  cmake -S "$SRC" -B "$W/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_CUDA_FLAGS_RELWITHDEBINFO="-O2 -DNDEBUG" \
    -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON \
    -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_SSE42=ON -DGGML_OPENMP=ON \
    -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DGGML_CUDA=ON -DGGML_CUDA_NCCL=OFF -DCMAKE_CUDA_ARCHITECTURES=90 >"$W/cmake.log" 2>&1 \
    || { tail -30 "$W/cmake.log" | tee -a "$OUT/log.txt"; return 1; }
  local t0=$SECONDS
  cmake --build "$W/build" -j"$(nproc)" --target llama llama-common ggml >"$W/build.log" 2>&1 \
    || { tail -40 "$W/build.log" | tee -a "$OUT/log.txt"; return 1; }
  log "build: $((SECONDS - t0)) s on $(nproc) cores"
  cc -O2 -o "$LB" scripts/bench/llama_decode_bench.c -I"$SRC/include" -I"$SRC/ggml/include" \
    -L"$B" -lllama -lggml -lggml-base -Wl,-rpath,"$B" || return 1
  ls -la "$B" | tee -a "$OUT/log.txt"
}

# `pack` brings the CUDA libraries and tools a call built back under $OUT
# (xz, in parts under the device tool's 16 MiB per file); copied into
# .devcarry/ they let a later call on a fresh machine skip the 5-minute build.
pack() {
  local t0=$SECONDS
  local d=$W/pack
  rm -rf "$d" && mkdir -p "$d" && (cd "$B" && cp -a *.so* llama-bench llama-server "$d"/ 2>/dev/null)
  find "$d" -type f -exec strip --strip-debug {} +
  tar -C "$d" -cf - --owner=0 --group=0 . | xz -T"$(nproc)" -6 | split -b 15m -d - "$OUT/cuda-build.tar.xz."
  log "pack: $(cat "$OUT"/cuda-build.tar.xz.* | wc -c) bytes in $((SECONDS - t0)) s"
}

unpack() {
  log "build: the libraries and tools a previous call built (.devcarry/cuda-build.tar.xz.*)"
  mkdir -p "$B" && cat .devcarry/cuda-build.tar.xz.* | xz -d | tar -C "$B" -xf - || return 1
  # The plain llama.cpp loop needs the headers: only where the sources came along.
  [ -f .devcarry/llama.cpp.tar.gz ] || { log "build: no sources, no plain-loop baseline"; return 0; }
  rm -rf "$SRC" && tar xzf .devcarry/llama.cpp.tar.gz -C "$W" || return 1
  cc -O2 -o "$LB" scripts/bench/llama_decode_bench.c -I"$SRC/include" -I"$SRC/ggml/include" \
    -L"$B" -lllama -lggml -lggml-base -Wl,-rpath,"$B" || return 1
  ls "$B" | tr '\n' ' ' | tee -a "$OUT/log.txt"; echo | tee -a "$OUT/log.txt"
}

# llama.cpp's own llama-bench and llama-server, built in the same CMake tree
# over the same libraries: the sdist's tools/llama-bench and tools/server, a
# stub tools/ui (no web assets: no npm, no network) and a tools/CMakeLists.txt
# that adds only mtmd, llama-bench, ui and server. The tarball's sources are
# already patched for the vendored common/ (docs/benchmarks.md says which).
tools() {
  if [ -x "$B/llama-bench" ]; then log "tools: already there"; return; fi
  [ -f .devcarry/llama-tools.tar.gz ] || { log "tools: no .devcarry/llama-tools.tar.gz"; return 1; }
  tar xzf .devcarry/llama-tools.tar.gz -C "$SRC/tools" || return 1
  local t0=$SECONDS
  cmake -S "$SRC" -B "$W/build" -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON >>"$W/cmake.log" 2>&1 \
    || { tail -30 "$W/cmake.log" | tee -a "$OUT/log.txt"; return 1; }
  cmake --build "$W/build" -j"$(nproc)" --target llama-bench >"$W/tools.log" 2>&1 \
    || { grep -E "error" "$W/tools.log" | head -30 | tee -a "$OUT/log.txt"; return 1; }
  log "tools: llama-bench in $((SECONDS - t0)) s"
  [ "${SERVER:-0}" = 1 ] || return 0
  cmake --build "$W/build" -j"$(nproc)" --target llama-server >>"$W/tools.log" 2>&1 \
    || { grep -E "error" "$W/tools.log" | head -30 | tee -a "$OUT/log.txt"; return 1; }
  log "tools: llama-server in $((SECONDS - t0)) s"
}

models() {
  [ -f "$DENSE" ] || { log "models: $DENSE"; "$S" dense --preset llama-8b -o "$DENSE" | tee -a "$OUT/log.txt"; }
  [ -f "$MOE" ] || { log "models: $MOE"; "$S" moe --preset mixtral-8x7b --layers 8 -o "$MOE" | tee -a "$OUT/log.txt"; }
  ls -la "$W"/*.gguf | tee -a "$OUT/log.txt"
}

# hypura CASE MODEL [hypura flags...]: one JSON line per run in results.jsonl.
hyp() {
  local case=$1 model=$2; shift 2
  late "hypura $case" && return 0
  for i in $(seq "$R"); do
    local j
    j=$("$H" run "$model" --raw -p "$PROMPT" --temperature 0 --max-tokens "$N" --threads "$T" --json "$@" 2>"$W/err.txt") \
      || { log "FAILED: hypura $case $*"; tail -5 "$W/err.txt" | tee -a "$OUT/log.txt"; return 1; }
    python3 - "$case" "$*" "$j" >>"$OUT/results.jsonl" <<'EOF'
import json, sys
case, flags, j = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
print(json.dumps({"case": case, "engine": "hypura", "flags": flags, "tokens": j["tokens"], **j["stats"]}))
EOF
  done
  tail -1 "$OUT/results.jsonl" | cut -c1-400 | tee -a "$OUT/log.txt"
}

# llamacpp CASE MODEL NGL [CPU_REGEX]: the plain llama.cpp loop.
llamacpp() {
  local case=$1 model=$2 ngl=$3; shift 3
  late "llama.cpp $case" && return 0
  for i in $(seq "$R"); do
    local j
    j=$("$LB" "$model" "$PROMPT" "$N" "$T" "$ngl" read "$@" 2>"$W/err.txt") \
      || { log "FAILED: llama.cpp $case"; tail -5 "$W/err.txt" | tee -a "$OUT/log.txt"; return 1; }
    python3 - "$case" "ngl=$ngl $*" "$j" >>"$OUT/results.jsonl" <<'EOF'
import json, sys
case, flags, j = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
print(json.dumps({"case": case, "engine": "llama.cpp", "flags": flags, **j}))
EOF
  done
  tail -1 "$OUT/results.jsonl" | cut -c1-400 | tee -a "$OUT/log.txt"
}

smoke() {
  log "smoke: devices and placement (llama.cpp's log)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$OUT/log.txt"
  ldd "$H" | grep -E 'llama|ggml' | tee -a "$OUT/log.txt"
  # What llama.cpp did with each placement: devices, offloaded layers, buffers.
  for flags in "$DENSE --gpu-layers 99" "$DENSE --gpu-layers 16" "$DENSE --mode full-resident --gpu-budget 1140MiB" \
      "$MOE --mode expert-streaming --gpu-layers 99" "$MOE --mode full-resident --gpu-budget 400MiB"; do
    log "placement: $flags"
    # shellcheck disable=SC2086
    RUST_LOG=llama.cpp=trace "$H" run $flags --raw -p "$PROMPT" --temperature 0 --max-tokens 4 2>&1 \
      | grep -E 'using device|offload|model buffer size|KV buffer size|overridden|error|Error|panick' \
      | sed -E 's/\x1b\[[0-9;]*m//g; s/^.*llama\.cpp: //; s/tensor blk\.[0-9]+\./tensor blk.N./; s/\([0-9]+ MiB/(/' \
      | sort | uniq -c | sort -rn | head -16 | tee -a "$OUT/log.txt"
  done
}

# CPU=0 leaves out the CPU-only cases (e.g. when re-measuring GPU cases).
CPU=${CPU:-1}

dense() {
  log "dense: Llama-8B-shaped Q4_K, $N tokens, $R runs, $T threads"
  # --gpu-layers 0 also keeps the planner (which uses the GPU) out of it.
  for ngl in 99 16 0; do
    [ "$ngl" = 0 ] && [ "$CPU" = 0 ] && continue
    llamacpp "dense-ngl$ngl" "$DENSE" "$ngl"
    hyp "dense-ngl$ngl" "$DENSE" --gpu-layers "$ngl"
  done
  # Attention, norms and output on the GPU (1132 MiB; one FFN tensor is
  # 31.5 MiB more than the budget leaves), FFN in RAM; llama.cpp the same way.
  llamacpp dense-attn-gpu-ffn-ram "$DENSE" 99 '\.ffn_(up|down|gate)\.'
  hyp dense-attn-gpu-ffn-ram "$DENSE" --mode full-resident --gpu-budget 1140MiB
  # The same GPU tensors, FFN streamed from the file (cache unbounded).
  R=1 hyp dense-attn-gpu-ffn-stream "$DENSE" --mode dense-ffn-streaming --gpu-layers 99
}

moe() {
  log "moe: Mixtral-shaped (8 layers) Q4_K, $N tokens, $R runs, $T threads"
  llamacpp moe-ngl99 "$MOE" 99
  hyp moe-ngl99 "$MOE" --gpu-layers 99
  # llama.cpp's --n-cpu-moe: every layer on the GPU but the experts in RAM.
  llamacpp moe-experts-ram "$MOE" 99 '\.ffn_(up|down|gate)_exps'
  # hypura: the same with a GPU budget that holds everything but the experts
  # (attention, norms, routers, output: 284 MiB; one expert tensor is 252 MiB).
  hyp moe-experts-ram "$MOE" --mode full-resident --gpu-budget 400MiB
  # Expert streaming + GPU: the same tensors on the GPU, experts STREAM (cache
  # unbounded: after the first tokens every used expert is cached).
  hyp moe-experts-stream "$MOE" --mode expert-streaming --gpu-layers 99
  if [ "$CPU" = 1 ]; then
    llamacpp moe-ngl0 "$MOE" 0
    R=1 hyp moe-cpu-stream "$MOE" --mode expert-streaming
  fi
  R=1 hyp moe-ngl0 "$MOE" --gpu-layers 0
  # Under a RAM budget (a third of the experts): NVMe reads every token.
  R=1 N=32 hyp moe-experts-stream-2g "$MOE" --mode expert-streaming --gpu-layers 99 --ram-budget 2GiB
}

# Moves into and out of GPU memory inside `hypura serve` (scripts/bench/gpu_serve.py):
# the dense model hot, the MoE cold; one GPU budget holds one of them in full.
serve() {
  late serve && return 0
  log "serve: GPU moves under one budget (hot $DENSE, cold $MOE)"
  python3 scripts/bench/gpu_serve.py "$H" "$DENSE" "$MOE" "$OUT" --threads "$T" \
    --gpu-budget "${SERVE_GPU_BUDGET:-8GiB}" --ram-budget "${SERVE_RAM_BUDGET:-6GiB}" \
    --seconds "${SERVE_SECONDS:-150}" 2>&1 | tail -40 | cut -c1-400 | tee -a "$OUT/log.txt"
}

# GPU by default: a plain `hypura serve MODEL --parallel 8` (no budget flag)
# must put the model on the GPU. Logs the start-up budget line, one request's
# decode tok/s, `hypura ps` (tier bytes) and the exit after SIGTERM.
gpudefault() {
  late gpudefault && return 0
  local port=11511 pid name
  name=$(basename "$DENSE" .gguf):latest
  log "gpudefault: hypura serve $DENSE --parallel 8 (no GPU flags)"
  "$H" serve "$DENSE" --port $port --parallel 8 --threads "$T" >"$W/serve-default.log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do grep -q "listening on" "$W/serve-default.log" && break; sleep 0.5; done
  grep "hypura:" "$W/serve-default.log" | tee -a "$OUT/log.txt"
  python3 - "$port" "$name" "$PROMPT" <<'EOF' 2>&1 | tee -a "$OUT/log.txt"
import json, sys, urllib.request
port, name, prompt = sys.argv[1:]
body = {"model": name, "prompt": prompt, "raw": True, "stream": False,
        "options": {"temperature": 0, "num_predict": 128}}
for run in range(2):  # the first one loads the model
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/generate", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    r = json.load(urllib.request.urlopen(req, timeout=600))
    print(f"gpudefault run {run}: {r['eval_count']} tokens, "
          f"{r['eval_count'] / r['eval_duration'] * 1e9:.1f} tok/s decode")
EOF
  HYPURA_HOST=127.0.0.1:$port "$H" ps 2>&1 | tee -a "$OUT/log.txt"
  HYPURA_HOST=127.0.0.1:$port "$H" ps --json 2>&1 | tee -a "$OUT/log.txt"
  kill -TERM "$pid"
  wait "$pid"
  log "gpudefault: serve exited with $? after SIGTERM"
  tail -3 "$W/serve-default.log" | tee -a "$OUT/log.txt"
}

# The full-size Mixtral shape served under 8 GiB of GPU and 12 GiB of RAM: the
# budget's streaming placement with its GPU share (the planner's hybrid: the
# last layers' experts on the GPU, the rest streamed). A warm-up request (it
# loads the model), then one 24-token greedy /api/generate; its decode tok/s
# (eval_count / eval_duration), the placement log lines and /api/ps go to
# results.jsonl. Under 150 s. SERVEMIX_FLAGS adds serve flags (the defaults
# are 4 slots of 4,096 tokens, whose KV cache takes GPU room from experts:
# e.g. SERVEMIX_FLAGS="--parallel 1 --context 2048").
servemix() {
  late servemix && return 0
  [ -f "$MOEFULL" ] || { log "servemix: no $MOEFULL (step bigmodel writes it)"; return 1; }
  local port=11512 pid name rc
  name=$(basename "$MOEFULL" .gguf):latest
  local flags="--gpu-budget 8GiB --ram-budget 12GiB ${SERVEMIX_FLAGS:-}"
  log "servemix: hypura serve $MOEFULL $flags ${PROFILE:+--profile $PROFILE}"
  drop_caches
  # shellcheck disable=SC2086
  "$H" serve "$MOEFULL" --host 127.0.0.1 --port $port --threads "$T" $flags \
    --shutdown-grace 2 ${PROFILE:+--profile "$PROFILE"} >"$W/serve-mix.log" 2>&1 &
  pid=$!
  for _ in $(seq 60); do grep -q "listening on" "$W/serve-mix.log" && break; sleep 0.5; done
  timeout 120 python3 - "$port" "$name" "$PROMPT" "$W/serve-mix.log" "$flags" >>"$OUT/results.jsonl" <<'EOF2'
import json, sys, time, urllib.request
port, name, prompt, log_path, flags = sys.argv[1:6]
url = f"http://127.0.0.1:{port}"
def generate(n):
    body = {"model": name, "prompt": prompt, "raw": True, "stream": False,
            "options": {"temperature": 0, "num_predict": n}}
    req = urllib.request.Request(f"{url}/api/generate", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=120))
t0 = time.time()
generate(2)  # loads the model
warm = time.time() - t0
r = generate(24)
ps = json.load(urllib.request.urlopen(f"{url}/api/ps", timeout=10))
lines = [l.strip() for l in open(log_path, errors="replace") if "hypura: placement of" in l]
placements = []
for l in lines:
    head, _, plan = l.partition(" | plan ")
    placements.append({"line": head[head.index("placement of"):], "plan": json.loads(plan) if plan else None})
print(json.dumps({"case": "servemix", "engine": "hypura-serve", "tokens": None,
                  "flags": flags.strip(),
                  "eval_count": r["eval_count"], "eval_duration_s": r["eval_duration"] / 1e9,
                  "tokens_per_second": r["eval_count"] / r["eval_duration"] * 1e9,
                  "prompt_tokens_per_second": r.get("prompt_eval_count", 0) / max(r.get("prompt_eval_duration", 0), 1) * 1e9,
                  "warmup_seconds": warm, "response": r["response"], "placements": placements,
                  "ps": ps.get("models", [])}))
EOF2
  rc=$?
  [ "$rc" = 0 ] || log "FAILED: servemix client (exit $rc)"
  grep -E "hypura: (placement|planning)|error|Error" "$W/serve-mix.log" | cut -c1-400 | tee -a "$OUT/log.txt"
  [ "$rc" = 0 ] && python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print("servemix: %d tokens, %.3f tok/s decode, warm-up %.1f s; ps: %s" % (r["eval_count"], r["tokens_per_second"], r["warmup_seconds"], json.dumps(r["ps"])[:600]))' \
    "$(tail -1 "$OUT/results.jsonl")" | tee -a "$OUT/log.txt"
  kill -TERM "$pid" 2>/dev/null
  wait "$pid"
  log "servemix: serve exited with $? after SIGTERM"
}

profile() {
  late profile && return 0
  log "profile (disk measured under $W, where the models are)"
  "$H" profile --json --refresh --path "$W" >"$OUT/h200-measured.json" 2>>"$W/stderr.txt" || log "profile failed"
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d["disk"]["reads"]=len(d["disk"].get("reads",[])); print(json.dumps(d))' \
    "$OUT/h200-measured.json" | tee -a "$OUT/log.txt"
}

# The planner's cases: its own choice (budgets from the profile), a GPU
# budget holding part of the dense model, and the MoE under GPU and RAM budgets.
PLAN_CASES=(
  "dense-auto|$DENSE|"
  "dense-gpu2.5g|$DENSE|--gpu-budget 2.5GiB"
  "moe-auto|$MOE|"
  "moe-gpu1g-ram3g|$MOE|--gpu-budget 1GiB --ram-budget 3GiB"
)

plan() {
  for c in "${PLAN_CASES[@]}"; do
    IFS='|' read -r case model flags <<<"$c"
    # shellcheck disable=SC2086
    "$H" inspect "$model" --plan --json $flags 2>>"$W/stderr.txt" \
      | python3 -c 'import json,sys; print(json.dumps({"case": sys.argv[1], "plan": json.load(sys.stdin)}))' "$case" \
      >>"$OUT/plans.jsonl" || log "plan failed: $case"
  done
  log "plans: $(wc -c <"$OUT/plans.jsonl") bytes"
}

bench() {
  for c in "${PLAN_CASES[@]}"; do
    IFS='|' read -r case model flags <<<"$c"
    late "bench $case" && continue
    # shellcheck disable=SC2086
    "$H" bench "$model" --json --threads "$T" $flags 2>"$W/err.txt" \
      | python3 -c 'import json,sys; print(json.dumps({"case": sys.argv[1], **json.load(sys.stdin)}))' "$case" \
      >>"$OUT/bench.jsonl" || { log "bench failed: $case"; tail -3 "$W/err.txt" | tee -a "$OUT/log.txt"; }
    tail -1 "$OUT/bench.jsonl" | cut -c1-600 | tee -a "$OUT/log.txt"
  done
}

summary() {
  python3 - "$OUT/results.jsonl" <<'EOF' | tee "$OUT/summary.txt"
import json, sys, statistics
from collections import OrderedDict
runs = [json.loads(l) for l in open(sys.argv[1])]
by = OrderedDict()
for r in runs:
    by.setdefault((r["case"], r["engine"]), []).append(r)
tok = {}
print(f"{'case':28} {'engine':10} {'decode tok/s':>12} {'prompt tok/s':>12}  runs  flags")
for (case, engine), rs in by.items():
    d = statistics.median(r["tokens_per_second"] for r in rs)
    p = statistics.median(r["prompt_tokens_per_second"] for r in rs)
    tok[(case, engine)] = (d, rs[0]["tokens"], {r.get("nvme_bytes_read") for r in rs})
    extra = ""
    if "expert_hits" in rs[0]:
        extra = f" hits={rs[-1].get('expert_hits')} misses={rs[-1].get('expert_misses')} nvme_bytes={rs[-1].get('nvme_bytes_read')}"
    same = all(r["tokens"] == rs[0]["tokens"] for r in rs)
    print(f"{case:28} {engine:10} {d:12.2f} {p:12.2f}  {len(rs)}{'' if same else ' (tokens differ between runs)'}  {rs[0]['flags']}{extra}")
print()
for case in dict.fromkeys(c for c, _ in by):
    if (case, "hypura") in tok and (case, "llama.cpp") in tok:
        h, l = tok[(case, "hypura")], tok[(case, "llama.cpp")]
        print(f"ratio hypura/llama.cpp {case:28} {h[0] / l[0]:.3f}  same tokens: {h[1] == l[1]}")
print()
def cmp(a, b):
    if a in tok and b in tok:
        x, y = tok[a][1], tok[b][1]
        n = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), None)
        m = min(len(x), len(y))
        print(f"tokens {a} vs {b}: " + (f"identical ({m} tokens)" if n is None else f"differ from token {n} of {m}"))
for a, b in [
    (("dense-ngl99", "hypura"), ("dense-ngl0", "hypura")),
    (("dense-ngl16", "hypura"), ("dense-ngl0", "hypura")),
    (("dense-attn-gpu-ffn-stream", "hypura"), ("dense-ngl0", "hypura")),
    (("dense-attn-gpu-ffn-stream", "hypura"), ("dense-attn-gpu-ffn-ram", "hypura")),
    (("dense-attn-gpu-ffn-ram", "hypura"), ("dense-ngl0", "hypura")),
    (("moe-experts-stream", "hypura"), ("moe-experts-ram", "hypura")),
    (("moe-experts-stream-2g", "hypura"), ("moe-experts-ram", "hypura")),
    (("moe-experts-ram", "hypura"), ("moe-ngl0", "hypura")),
    (("moe-ngl99", "hypura"), ("moe-ngl0", "hypura")),
    (("moe-cpu-stream", "hypura"), ("moe-ngl0", "hypura")),
    (("moe-ngl0", "hypura"), ("moe-ngl0", "llama.cpp")),
    (("dense-ngl0", "hypura"), ("dense-ngl0", "llama.cpp")),
]:
    cmp(a, b)
EOF
}

# --- Side by side with llama.cpp's own tools (llama-bench); `hypura bench`
# with warm-up and repetitions. One JSON line per run in vs.jsonl.
VS=$OUT/vs.jsonl

# hb CASE MODEL [hypura bench flags...]: the bench report, with the peak RSS
# (KiB) of the hypura process; inside a cgroup of memory.max $CG when set.
# Several prompt sizes (`--prompt-tokens 512,2048,1`) give one report each,
# as cases CASE-ppN.
# HB_LOGS=DIR: hypura's stderr (its log) kept as DIR/CASE.log.
hb() {
  local case=$1 model=$2; shift 2
  late "hypura bench $case" && return 0
  log "hypura bench $case: $* ${CG:+(cgroup memory.max $CG)}"
  local wrap=()
  if [ -n "${CG:-}" ]; then
    local cg=/sys/fs/cgroup/hypura-hb
    cgroup_at "$cg" "$CG" || { log "$case skipped"; return 1; }
    wrap=(sh -c "echo \$\$ > $cg/cgroup.procs && exec \"\$@\"" sh)
  fi
  # HB_ARGS: more `hypura bench` options for every case (e.g. --read-queue-depth 8).
  # shellcheck disable=SC2086
  python3 - "$case" "${wrap[@]}" "$H" bench "$model" --json --threads "$HT" ${PROFILE:+--profile "$PROFILE"} "$@" ${HB_ARGS:-} >>"$VS" 2>"$W/err.txt" <<'EOF'
import json, os, resource, subprocess, sys
case, cmd = sys.argv[1], sys.argv[2:]
r = subprocess.run(cmd, capture_output=True, text=True)
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
if os.environ.get("HB_LOGS"):
    os.makedirs(os.environ["HB_LOGS"], exist_ok=True)
    with open(os.path.join(os.environ["HB_LOGS"], case + ".log"), "w") as f:
        f.write(r.stderr)
if r.returncode != 0:
    sys.stderr.write(r.stderr[-2000:])
    sys.exit(1)
lines = [json.loads(l) for l in r.stdout.splitlines() if l.strip()]
for rep in lines:
    name = f"{case}-pp{rep['prompt_tokens']}" if len(lines) > 1 else case
    print(json.dumps({"case": name, "engine": "hypura", "args": " ".join(cmd[cmd.index("bench") + 2:]),
                      "peak_rss_kib": rss, **rep}))
EOF
  # shellcheck disable=SC2181
  [ $? -eq 0 ] || { log "FAILED: hypura bench $case"; tail -5 "$W/err.txt" | tee -a "$OUT/log.txt"; return 1; }
  [ -n "${CG:-}" ] && log "cgroup peak (memory.peak): $(cat /sys/fs/cgroup/hypura-hb/memory.peak 2>/dev/null) bytes"
  tail -3 "$VS" | cut -c1-900 | tee -a "$OUT/log.txt"
}

# lb CASE MEMORY_MAX MODEL [llama-bench flags...]: llama-bench -o json, in a
# cgroup v2 of that memory.max (page cache included) unless it is "-".
lb() {
  local case=$1 max=$2 model=$3; shift 3
  late "llama-bench $case" && return 0
  [ -x "$B/llama-bench" ] || { log "no llama-bench: $case skipped"; return 1; }
  log "llama-bench $case (memory.max $max): $*"
  local cg=/sys/fs/cgroup/hypura-llb peak=""
  local run=("$B/llama-bench" -m "$model" -t "$T" -o json "$@")
  if [ "$max" != - ]; then
    cgroup_at "$cg" "$max" || { log "$case skipped"; return 1; }
    run=(sh -c "echo \$\$ > $cg/cgroup.procs && exec \"\$@\"" sh "${run[@]}")
  fi
  "${run[@]}" >"$W/lb.json" 2>"$W/err.txt" \
    || { log "FAILED: llama-bench $case"; tail -5 "$W/err.txt" | tee -a "$OUT/log.txt"; return 1; }
  [ "$max" != - ] && peak=$(cat "$cg/memory.peak" 2>/dev/null)
  python3 - "$case" "$*" "$W/lb.json" "$peak" >>"$VS" <<'EOF'
import json, sys
case, flags, path, peak = sys.argv[1:5]
for t in json.load(open(path)):
    kind = "prompt" if t["n_gen"] == 0 else "decode"
    print(json.dumps({"case": case, "engine": "llama-bench", "kind": kind, "args": flags,
                      "avg_ts": t["avg_ts"], "stddev_ts": t["stddev_ts"], "n_prompt": t["n_prompt"],
                      "n_gen": t["n_gen"], "cgroup_peak_bytes": int(peak) if peak else None}))
EOF
  tail -2 "$VS" | tee -a "$OUT/log.txt"
}

# cgroup_at DIR MAX: a new cgroup v2 at DIR with memory.max = MAX (and no swap);
# fails where /sys/fs/cgroup is not a writable cgroup2 file system.
cgroup_at() {
  [ "$(stat -fc %T /sys/fs/cgroup 2>/dev/null)" = cgroup2fs ] || { log "/sys/fs/cgroup is not cgroup v2"; return 1; }
  grep -qw memory /sys/fs/cgroup/cgroup.subtree_control || echo +memory >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
  rmdir "$1" 2>/dev/null  # a fresh one: an old one's memory.peak is an earlier run's
  mkdir -p "$1" 2>/dev/null && echo "$2" >"$1/memory.max" 2>/dev/null || { log "cgroup $1 not writable"; return 1; }
  echo 0 >"$1/memory.swap.max" 2>/dev/null
  log "cgroup $1: memory.max $(cat "$1/memory.max")"
}

drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || log "drop_caches not writable"; }

# The engine's GPU tests (backends/llama-tiered/tests/gpu.rs), built on the
# dev machine with the binary (`cargo test --release -p llama-tiered -p hypura
# --features hypura/dynamic-link --test gpu --no-run`, stripped, xz'd into
# .devcarry/gpu-test.xz); where no GPU is seen they skip their GPU half.
gputest() {
  local t=$PWD/.devcarry/gpu-test
  [ -x "$t" ] || { [ -f "$t.xz" ] && xz -dc "$t.xz" >"$t" && chmod +x "$t"; } || { log "gputest: no test binary"; return 1; }
  log "gputest: backends/llama-tiered/tests/gpu.rs on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
  "$t" --test-threads 1 --nocapture >"$W/gputest.txt" 2>&1
  local rc=$?
  grep -E "^test |skipped|test result|panicked" "$W/gputest.txt" | tee -a "$OUT/log.txt"
  log "gputest: rc $rc"
}

# Llama-8B shape, everything on the GPU, 5 repetitions each. llama-bench's
# tg128 decodes from an empty KV cache: hypura's `--prompt-tokens 1` run is
# the one beside it (its argmax on the GPU, and on the host from the copied
# logits as llama.cpp's default sampling takes it). pp512 beside pp512; and
# tg128 after a 512-token prompt beside llama-bench's `-d 512`.
vsdense() {
  lb dense-all-gpu - "$DENSE" -ngl 99 -p 512 -n 128 -r 5
  lb dense-d512 - "$DENSE" -ngl 99 -p 0 -n 128 -d 512 -r 5
  # tg128 in DENSE_ROUNDS (default 3) alternated rounds: one run of each
  # varies by about 1% from the next on this machine, as much as the two
  # differ. llama-bench with one thread too: hypura computes a one-token step
  # on one host thread when only the input row lookup is on the host.
  local round
  for round in $(seq "${DENSE_ROUNDS:-3}"); do
    hb dense-tg128 "$DENSE" --prompt-tokens 1 --tokens 128 --repetitions 5
    lb dense-tg - "$DENSE" -ngl 99 -p 0 -n 128 -r 5
    T=1 lb dense-tg-t1 - "$DENSE" -ngl 99 -p 0 -n 128 -r 5
  done
  hb dense-tg128-host-argmax "$DENSE" --prompt-tokens 1 --tokens 128 --repetitions 5 --host-argmax
  hb dense-pp512-tg128 "$DENSE" --prompt-tokens 512 --tokens 128 --repetitions 5
}

# Single stream against llama.cpp choosing tokens itself: llama-bench's tg128
# decodes without choosing any (it feeds one token over and over), so beside
# it and hypura, in alternated rounds, the plain llama.cpp loop
# (scripts/bench/llama_decode_bench.c, 129 greedy tokens, 5 runs after a
# warm-up) taking each argmax on the host from the copied logits, llama.cpp's
# usual way, and with llama.cpp's own greedy sampler inside the decode graph.
vsloop() {
  [ -x "$LB" ] || { log "vsloop: no plain loop (it needs .devcarry/llama.cpp.tar.gz)"; return 1; }
  local round
  for round in $(seq "${DENSE_ROUNDS:-3}"); do
    hb dense-tg128 "$DENSE" --prompt-tokens 1 --tokens 128 --repetitions 5
    lb dense-tg - "$DENSE" -ngl 99 -p 0 -n 128 -r 5
    loop dense-loop-host "$DENSE"
    LOOP_SAMPLER=device loop dense-loop-device "$DENSE"
  done
}

# loop CASE MODEL: the plain llama.cpp loop, all layers on the GPU; one row in vs.jsonl.
loop() {
  local case=$1 model=$2
  late "llama.cpp loop $case" && return 0
  log "llama.cpp loop $case (${LOOP_SAMPLER:-host} argmax)"
  LOOP_WARMUP=1 LOOP_REPS=5 "$LB" "$model" "$PROMPT" 129 "$T" 99 read >"$W/loop.json" 2>"$W/err.txt" \
    || { log "FAILED: llama.cpp loop $case"; tail -5 "$W/err.txt" | tee -a "$OUT/log.txt"; return 1; }
  python3 - "$case" "$W/loop.json" >>"$VS" <<'EOF2'
import json, sys
case, j = sys.argv[1], json.load(open(sys.argv[2]))
print(json.dumps({"case": case, "engine": "llama.cpp loop", "sampler": j["sampler"],
                  "tokens_per_second": j["tokens_per_second"], "runs": j["runs"], "tokens": j["tokens"][:16]}))
EOF2
  tail -1 "$VS" | tee -a "$OUT/log.txt"
}

# Where the time of one decode step goes, hypura against llama-bench (tg64,
# Llama-8B shape on the GPU), from nsys's kernel and CUDA API summaries.
nsysdense() {
  late nsysdense && return 0
  local nsys f
  nsys=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
  [ -n "$nsys" ] || { log "nsysdense: no nsys here"; return 0; }
  log "nsysdense: $nsys"
  "$nsys" profile -o "$W/nsys-hypura" -f true -t cuda,osrt --stats=false \
    "$H" bench "$DENSE" --json --threads "$T" ${PROFILE:+--profile "$PROFILE"} --prompt-tokens 1 --tokens 64 --repetitions 2 >/dev/null 2>&1
  "$nsys" profile -o "$W/nsys-llama" -f true -t cuda,osrt --stats=false \
    "$B/llama-bench" -m "$DENSE" -ngl 99 -p 0 -n 64 -r 2 -t "$T" >/dev/null 2>&1
  for f in hypura llama; do
    "$nsys" stats -q -r cuda_gpu_kern_sum,cuda_api_sum -f csv "$W/nsys-$f.nsys-rep" 2>/dev/null \
      | head -60 >"$OUT/nsys-$f.csv"
  done
  log "nsysdense: $(wc -l "$OUT"/nsys-*.csv | tail -1)"
}

# Decode steps of N sequences at once (hypura bench --parallel N: each its
# own KV stream, as serve runs them), the argmax on the GPU and, at the
# largest N, on the host from the copied logits as llama.cpp's default
# sampling does: the cost of a step against the number of sequences.
batched() {
  local n
  for n in ${BATCHED:-1 8 32 64}; do
    hb "dense-parallel$n" "$DENSE" --parallel "$n" --prompt-tokens 32 --tokens 64 --repetitions 3
  done
  hb "dense-parallel$n-host-argmax" "$DENSE" --parallel "$n" --prompt-tokens 32 --tokens 64 --repetitions 3 --host-argmax
}

# Serving: aggregate completion tok/s and time to first token with N clients
# (1, 8, 32, 64; 128-token greedy completions, 2 requests each), llama-server
# with several flag sets against `hypura serve`, same file, same libraries.
srv_wait() { # PORT LOG PID
  local i
  for i in $(seq 600); do
    python3 -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=2)" \
      "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0
    kill -0 "$3" 2>/dev/null || { tail -5 "$2" | tee -a "$OUT/log.txt"; return 1; }
    sleep 0.5
  done
  return 1
}

srv_load() { # LABEL PORT MODEL
  local n
  # warm-up: loads (hypura loads on first use), first kernels
  python3 scripts/bench/serve_load.py "http://127.0.0.1:$2" "$3" --clients 2 --requests 1 --max-tokens 16 >/dev/null
  for n in ${SRV_CLIENTS:-1 8 32 64}; do
    late "serve $1 N=$n" && return 0
    python3 scripts/bench/serve_load.py "http://127.0.0.1:$2" "$3" --clients "$n" --requests "${SRV_REQUESTS:-2}" \
      --label "$1" >>"$OUT/serve.jsonl" || log "serve $1 N=$n failed"
    tail -1 "$OUT/serve.jsonl" | tee -a "$OUT/log.txt"
  done
}

# SRV_LLAMA: llama-server flag sets, one "name|flags" per line;
# SRV_HYPURA: hypura serve --parallel values.
vsserver() {
  local port=11620 pid name flags
  if [ -x "$B/llama-server" ]; then
    while IFS='|' read -r name flags; do
      [ -n "$name" ] || continue
      late "llama-server $name" && break
      log "llama-server $name: $flags"
      # shellcheck disable=SC2086
      "$B/llama-server" -m "$DENSE" --host 127.0.0.1 --port $port -ngl 99 -t "$T" --no-webui $flags \
        >"$W/llama-server-$name.log" 2>&1 </dev/null &
      pid=$!
      srv_wait $port "$W/llama-server-$name.log" $pid && srv_load "llama-server $name" $port dense
      kill $pid; wait $pid 2>/dev/null
      port=$((port + 1))
    done <<EOF
${SRV_LLAMA:-np8|-np 8 -c 16384
np64-kvu|-np 64 -c 65536 -kvu
np64-kvu-bs|-np 64 -c 65536 -kvu -bs}
EOF
  else
    log "no llama-server: its runs skipped"
  fi
  for flags in ${SRV_HYPURA:-64}; do
    late "hypura serve --parallel $flags" && return 0
    log "hypura serve --parallel $flags --context 1024"
    "$H" serve "$DENSE" --port $port --parallel "$flags" --context 1024 --threads "$T" \
      ${PROFILE:+--profile "$PROFILE"} >"$W/hypura-serve.log" 2>&1 </dev/null &
    pid=$!
    srv_wait $port "$W/hypura-serve.log" $pid \
      && srv_load "hypura parallel $flags" $port "$(basename "$DENSE" .gguf):latest"
    grep "hypura: placement" "$W/hypura-serve.log" | cut -c1-300 | tee -a "$OUT/log.txt"
    kill -TERM $pid; wait $pid 2>/dev/null
    port=$((port + 1))
  done
}

# Streaming with every expert cached against the experts in RAM, the same
# tensors elsewhere on the same devices (Mixtral-8L): with the GPU (attention
# and routers there, experts on the CPU) and CPU only.
cached() {
  local gpu round
  # Alternated, CACHED_ROUNDS times (default 3): one run of each varies by
  # a few percent from one to the next on this machine.
  for gpu in 400MiB 0; do
    for round in $(seq "${CACHED_ROUNDS:-3}"); do
      hb "moe-ram-gpu$gpu" "$MOE" --mode full-resident --gpu-budget $gpu --tokens 64 --prompt-tokens 64 --repetitions 3
      hb "moe-cached-gpu$gpu" "$MOE" --mode expert-streaming --gpu-budget $gpu --tokens 64 --prompt-tokens 64 --repetitions 3
    done
  done
}

# Exactness of the hybrid placement on the GPU: half the expert layers on the
# GPU, the rest streamed under a RAM budget that evicts, against full-resident
# with the same GPU tensors (the planner puts the same ones there) and the
# other experts in RAM.
exact() {
  R=1 hyp hybrid-stream "$MOE" --mode expert-streaming --gpu-budget 3584MiB --ram-budget 2GiB
  R=1 hyp hybrid-ram "$MOE" --mode full-resident --gpu-budget 3584MiB
  # Past 32 prompt tokens llama.cpp computes host-memory experts on the GPU
  # (op_offload), streamed ones included.
  local long="$PROMPT"
  for _ in 1 2 3 4 5 6; do long="$long, and the story of its streets, bridges and people"; done
  PROMPT=$long R=1 hyp hybrid-stream-long "$MOE" --mode expert-streaming --gpu-budget 3584MiB --ram-budget 2GiB
  PROMPT=$long R=1 hyp hybrid-ram-long "$MOE" --mode full-resident --gpu-budget 3584MiB
  python3 - "$OUT/results.jsonl" <<'PY' | tee -a "$OUT/log.txt"
import json, sys
rows = {j["case"]: j for j in map(json.loads, open(sys.argv[1])) if j.get("case", "").startswith("hybrid-")}
for prompt in ("", "-long"):
    a, b = rows.get(f"hybrid-stream{prompt}"), rows.get(f"hybrid-ram{prompt}")
    if a and b:
        print(f"exact{prompt or '-short'}: streamed vs experts in RAM, same {len(a['tokens'])} tokens: {a['tokens'] == b['tokens']}"
              f" (prompt tok/s {a['prompt_tokens_per_second']:.1f} vs {b['prompt_tokens_per_second']:.1f})")
PY
}

# The full-size Mixtral-8x7B shape (26.3 GB). May run in the background
# beside `build` (it needs no llama.cpp); a later call waits for a writer
# still at work rather than starting a second one.
bigmodel() {
  local pid
  pid=$(cat "$W/bigmodel.pid" 2>/dev/null)
  if [ ! -f "$MOEFULL" ] && [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    log "models: waiting for the writer of $MOEFULL (pid $pid)"
    while kill -0 "$pid" 2>/dev/null; do sleep 2; done
  fi
  if [ ! -f "$MOEFULL" ]; then
    late bigmodel && return 0
    log "models: $MOEFULL"
    echo $$ >"$W/bigmodel.pid"
    "$S" moe --preset mixtral-8x7b -o "$MOEFULL.part" | tail -3 | tee -a "$OUT/log.txt"
    # Renamed when complete: a call cut short leaves no half file under the name.
    [ "${PIPESTATUS[0]}" = 0 ] && mv "$MOEFULL.part" "$MOEFULL" && log "models: written"
  fi
  ls -la "$MOEFULL" | tee -a "$OUT/log.txt"
  df -h "$W" | tail -1 | tee -a "$OUT/log.txt"
}

# Full-size Mixtral shape under 8 GiB of GPU and 12 GiB of RAM: hypura's plan
# against llama-bench with every layer on the GPU but the experts of the first
# NCMOE layers (23: the most expert layers 8 GiB holds), mmap, in a cgroup of
# 12 GiB; page cache dropped before each.
vsmixtral() {
  # hypura outside any cgroup too, unless MIX_OUTSIDE=0.
  if [ "${MIX_OUTSIDE:-1}" = 1 ]; then
    drop_caches
    hb mixtral-8g-12g "$MOEFULL" --gpu-budget 8GiB --ram-budget 12GiB --prompt-tokens 16 \
      --tokens "${MIX_TOKENS:-32}" --repetitions 1
  fi
  local n
  for n in ${NCMOE:-23}; do
    drop_caches
    lb "mixtral-ncmoe$n" "${MIX_LB_MAX:-12G}" "$MOEFULL" -ngl 99 --n-cpu-moe "$n" -p 0 -n "${MIX_LB_TOKENS:-16}" -r 1
  done
  # The same memory for both: hypura inside the same cgroup as llama-bench
  # (MIX_LB_MAX: the RAM budget plus the host overhead `hypura profile`
  # measures), at --ram-budget MIX_CG_RAM.
  [ "${MIX_CG:-1}" = 1 ] || return 0
  drop_caches
  CG=${MIX_LB_MAX:-12G} hb mixtral-8g-12g-cgroup "$MOEFULL" --gpu-budget 8GiB --ram-budget "${MIX_CG_RAM:-10GiB}" --prompt-tokens 16 \
    --tokens "${MIX_TOKENS:-32}" --repetitions 1
}

# Prompt processing on a too-big MoE (issue 26): the full Mixtral-8x7B shape
# routed as Mixtral's published statistics (`--routing mixtral`, its own
# file), 8 GiB GPU + 12 GiB RAM. hypura bench, one load: pp512, pp2048 and a
# 1-token prompt, each with its decode (PROMPT_SIZES, MIX_TOKENS; a report's
# `prompt_stream` says how many bytes a prompt read against the streamed
# bytes, its `n_ubatch` the pass size the planner took, `stream.step_nvme_bytes`,
# `step_seconds` and `step_stall_seconds` what each decode step read, took and
# waited on reads);
# llama-bench: pp512, pp2048 and decode at each --n-cpu-moe of MIXP_NCMOE
# (default "22 23": the best at this memory), with its default -ub 512 and
# with -ub 2048. Both in a cgroup of MIX_LB_MAX (the RAM budget plus the host
# overhead) unless MIX_CG=0; page cache dropped before each.
# MOEMIX: another file of the same shape and routing may stand in (gpu-agent.sh's
# bigmodel, written by a hypura-synth whose Mixtral presets default to --routing mixtral).
# The context of a hypura bench run of the prompt sizes $1 (comma-separated):
# its longest prompt and decode, as llama-bench sizes each test's context
# (prompt + generated tokens), not hb's default 4096: equal memory means the
# same KV cache (Qwen3's at 4096 is 0.40 GB of its 4 GiB GPU budget;
# llama-bench's pp512 holds 0.05 GB).
pp_context() {
  local s m=0 sizes=$1
  for s in ${sizes//,/ }; do [ "$s" -gt "$m" ] && m=$s; done
  echo $((m + ${MIX_TOKENS:-8} + 1))
}

# hb_prompts CASE GROUPS MODEL HB_ARGS...: hypura bench once per group of
# prompt sizes (GROUPS: space-separated, each comma-separated, e.g. "512,1
# 2048"), each load at its group's context (pp_context); a group of one size
# names its case CASE-ppSIZE, as hb names each size of a larger group.
hb_prompts() {
  local case=$1 groups=$2 model=$3 g name; shift 3
  for g in $groups; do
    name=$case; [ "${g//,/}" = "$g" ] && name=$case-pp$g
    hb "$name" "$model" "$@" --context "$(pp_context "$g")" --prompt-tokens "$g" \
      --tokens "${MIX_TOKENS:-8}" --repetitions "${PROMPT_REPS:-1}"
  done
}
MOEMIX=${MOEMIX:-$W/mixtral-8x7b-routed-q4k.gguf}
vsmixprompt() {
  if [ ! -f "$MOEMIX" ]; then
    late vsmixprompt && return 0
    log "models: $MOEMIX (--routing mixtral)"
    "$S" moe --preset mixtral-8x7b --routing mixtral -o "$MOEMIX.part" | tail -3 | tee -a "$OUT/log.txt"
    [ "${PIPESTATUS[0]}" = 0 ] && mv "$MOEMIX.part" "$MOEMIX" || return 1
  fi
  local cg=${MIX_LB_MAX:-13197090816} ram=${MIX_CG_RAM:-12GiB} n
  [ "${MIX_CG:-1}" = 1 ] || cg=-
  local hcg=$cg; [ "$hcg" = - ] && hcg=
  drop_caches
  profile_now "$MOEMIX" mixtral
  # One load: pp512 and pp2048, each followed by MIX_TOKENS decoded, then a
  # 1-token prompt and its decode (llama-bench's tg: no prompt pass before it);
  # its KV at 2,057 tokens leaves the same experts on the GPU as at 521.
  CG=$hcg hb_prompts "mixtral-routed${CASE_TAG:-}" "${PROMPT_SIZES:-512,2048,1}" "$MOEMIX" \
    --gpu-budget 8GiB --ram-budget "$ram"
  # MIX_RECYCLE_AB=1: the decode from a 1-token prompt again with evicted
  # pages released instead of moved to the next load (HYPURA_STREAM_RECYCLE=0),
  # on the same disk minutes apart: what page recycling is worth here.
  if [ "${MIX_RECYCLE_AB:-0}" = 1 ]; then
    drop_caches
    HYPURA_STREAM_RECYCLE=0 CG=$hcg hb mixtral-routed-norecycle-pp1 "$MOEMIX" --gpu-budget 8GiB \
      --ram-budget "$ram" --context 2057 --prompt-tokens 1 --tokens "${MIX_TOKENS:-8}"
    drop_caches
    CG=$hcg hb mixtral-routed-recycle-pp1 "$MOEMIX" --gpu-budget 8GiB \
      --ram-budget "$ram" --context 2057 --prompt-tokens 1 --tokens "${MIX_TOKENS:-8}"
  fi
  # PROMPT_REPS: timed repetitions of each pp512 (default 1).
  # PROMPT_PINNED=1: pp512 again with the stream cache's whole layers
  # registered with the driver (HYPURA_PIN_STREAM=1), what that is worth.
  if [ "${PROMPT_PINNED:-0}" = 1 ]; then
    drop_caches
    HYPURA_PIN_STREAM=1 CG=$hcg hb mixtral-routed-pp512-pinned "$MOEMIX" --gpu-budget 8GiB \
      --ram-budget "$ram" --prompt-tokens 512 --tokens "${MIX_TOKENS:-8}" --repetitions "${PROMPT_REPS:-1}"
  fi
  # MIXP_LB_ARGS: llama-bench's tests (default pp512, pp2048 and decode at
  # -ub 512 and 2048; its best for prompts at this memory is -ub 2048).
  # PROMPT_LB=0: hypura only.
  [ "${PROMPT_LB:-1}" = 1 ] || return 0
  local args=(${MIXP_LB_ARGS:--p 512,2048 -n ${MIX_TOKENS:-8} -ub 512,2048 -r 1})
  for n in ${MIXP_NCMOE:-22 23}; do
    drop_caches
    lb "mixtral-routed-ncmoe$n" "$cg" "$MOEMIX" -ngl 99 --n-cpu-moe "$n" "${args[@]}"
  done
}

# The same on the Qwen3-30B-A3B shape (issue 26's second shape): `--routing qwen3`, 4 GiB GPU +
# 8 GiB RAM, each run in a cgroup of 8 GiB plus the host overhead (QWEN_LB_MAX); llama-bench
# at each --n-cpu-moe of QWENP_NCMOE (default 40: 4 GiB less every layer's attention, router,
# norms and output (0.82 GB), the KV at -c 4096 (0.40 GB) and a compute buffer (~0.3 GB)
# leaves 2.8 GB, 8 layers of experts at 0.34 GB each; `hypura inspect --json` gives the sizes).
MOEQWEN=${MOEQWEN:-$W/qwen3-30b-a3b-routed-q4k.gguf}
# qwenmodel: writes MOEQWEN if missing. As a step of its own it can run before
# other work: a virtual disk reads slowly for a minute or more after a large
# write (on the H200 machine, 0.9-1.4 GB/s right after this 17 GB write, 1.6-1.7
# a minute later), which a run right after the write would measure.
qwenmodel() {
  [ -f "$MOEQWEN" ] && return 0
  late qwenmodel && return 0
  log "models: $MOEQWEN (--routing qwen3)"
  "$S" moe --preset qwen3-30b-a3b --routing qwen3 -o "$MOEQWEN.part" | tail -3 | tee -a "$OUT/log.txt"
  [ "${PIPESTATUS[0]}" = 0 ] && mv "$MOEQWEN.part" "$MOEQWEN" && sync
}
vsqwenprompt() {
  qwenmodel || return 1
  [ -f "$MOEQWEN" ] || return 0
  local cg=${QWEN_LB_MAX:-8902123520} n
  drop_caches
  profile_now "$MOEQWEN" qwen3
  # CASE_TAG: a suffix for the case names (runs of one call that differ in HB_ARGS).
  # Two loads, each at its tests' context as llama-bench runs them: at 4 GiB the
  # KV for 2,057 tokens leaves 9 of 48 layers' experts on the GPU, for 521
  # tokens 10 (0.34 GB less read each pass). PROMPT_SIZES: groups, one load each.
  CG=$cg hb_prompts "qwen3-routed${CASE_TAG:-}" "${PROMPT_SIZES:-512,1 2048}" "$MOEQWEN" \
    --gpu-budget 4GiB --ram-budget 8GiB
  if [ "${PROMPT_PINNED:-0}" = 1 ]; then
    drop_caches
    HYPURA_PIN_STREAM=1 CG=$cg hb qwen3-routed-pp512-pinned "$MOEQWEN" --gpu-budget 4GiB \
      --ram-budget 8GiB --prompt-tokens 512 --tokens "${MIX_TOKENS:-8}" --repetitions "${PROMPT_REPS:-1}"
  fi
  [ "${PROMPT_LB:-1}" = 1 ] || return 0
  local args=(${QWENP_LB_ARGS:--p 512,2048 -n ${MIX_TOKENS:-8} -ub 512,2048 -r 1})
  for n in ${QWENP_NCMOE:-40}; do
    drop_caches
    lb "qwen3-routed-ncmoe$n" "$cg" "$MOEQWEN" -ngl 99 --n-cpu-moe "$n" "${args[@]}"
  done
}

# qwenrecycle: the Qwen3 shape's decode after a 512-token prompt with evicted
# pages released (HYPURA_STREAM_RECYCLE=0), then moved to the next load, on the
# same disk minutes apart, as MIX_RECYCLE_AB does for Mixtral: its 18,432 unit
# ranges recycle since the mapping room replaced the 8,192-range cap (session
# 28). The prompt fills the stream cache first: after a 1-token prompt, 16
# tokens read 37 MB each into a cache of 8.3 GB that never filled, so nothing
# was evicted and both arms measured the same thing (session 29).
qwenrecycle() {
  qwenmodel || return 1
  [ -f "$MOEQWEN" ] || return 0
  local cg=${QWEN_LB_MAX:-8902123520} rc
  for rc in 0 1; do
    late "qwenrecycle $rc" && return 0
    drop_caches
    HYPURA_STREAM_RECYCLE=$rc CG=$cg hb "qwen3-routed-recycle$rc-pp512" "$MOEQWEN" --gpu-budget 4GiB \
      --ram-budget 8GiB --context 529 --prompt-tokens 512 --tokens "${MIX_TOKENS:-8}" --repetitions 1
  done
}

# routingseed: each MoE shape decodes once before the figures (not timed, no
# record), so that the planner prices it by the expert popularity its streamer
# measured, as it does a served model that has run (session 29): the streamer
# saves a decode's co-activation counts in the cache directory, and the planner
# trusts them from 16 choices an expert a layer (`MIN_SELECTIONS_PER_EXPERT`):
# 64 tokens for Mixtral's 8 experts (top-2), 256 for Qwen3's 128 (top-8).
# Both shapes' budgets as their figures'; the cache directory is the same.
# The streamer also saves the rates it read at, a decode's and a prompt pass's
# (`reads/KEY.json`), and the planner prices the shape's later runs on this
# machine by them, not by the profile's probe (session 30: the streamer reads
# faster inside a decode than any probe outside one), hence the 512-token
# prompt before the decode, twice (the warm-up's): a cold pass and a warm
# one, whose rates the planner prices those passes by (session 31: a
# model's first pass reads slower than later ones, and neither reads at the
# decode's rate). Each seed runs the plan of its shape's figures
# (this machine's profile now, the figures' context, or Qwen3's smallest
# that holds the seed's 512 + 288 tokens), so that what it measured is
# what they read: session 31's first seed ran the H200 profile
# and a shorter context, and its Mixtral decode read 2.66 GB/s where the
# figures a minute later read 2.08-2.18; under the figures' plan, 1.67
# against 1.68-1.77.
routingseed() {
  local spec model gpu ram tokens context tag saved=${PROFILE:-}
  qwenmodel || true
  for spec in "$MOEMIX|8GiB|12GiB|${SEED_MIX_TOKENS:-80}|2065|mixtral" \
    "$MOEQWEN|4GiB|8GiB|${SEED_QWEN_TOKENS:-288}|816|qwen3"; do
    IFS='|' read -r model gpu ram tokens context tag <<<"$spec"
    [ -f "$model" ] || { log "routingseed: no $model"; continue; }
    late "routingseed $model" && return 0
    profile_now "$model" "seed-$tag"
    log "routingseed: $tokens tokens of $(basename "$model")"
    "$H" bench "$model" --json --threads "$HT" ${PROFILE:+--profile "$PROFILE"} --gpu-budget "$gpu" \
      --ram-budget "$ram" --context "$context" --prompt-tokens 512 --tokens "$tokens" \
      --repetitions 1 >/dev/null 2>"$W/seed-err.txt" ||
      log "routingseed failed: $model: $(grep -v DEBUG "$W/seed-err.txt" | tail -n 2)"
    PROFILE=$saved
  done
  local cache=${HYPURA_CACHE_DIR:-$HOME/.cache/hypura}
  ls -la "$cache/coactivation" 2>&1 | tee -a "$OUT/log.txt"
  head -c 2000 "$cache"/reads/*.json 2>&1 | tee -a "$OUT/log.txt"
}

# One table: hypura beside llama-bench per case, with ratios.
table() {
  python3 - "$VS" "$OUT/results.jsonl" <<'EOF' | tee "$OUT/table.txt"
import json, os, sys
rows = [json.loads(l) for l in open(sys.argv[1])] if os.path.exists(sys.argv[1]) else []
# A case run several times (`cached`'s rounds): the mean of its runs' rates,
# with the spread between runs as its sd; each run's rate in "runs".
by_case = {}
for r in rows:
    if r["engine"] == "hypura":
        by_case.setdefault(r["case"], []).append(r)
def mean_sd(xs):
    m = sum(xs) / len(xs)
    return m, (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5
def merged(runs):
    h = dict(runs[-1])
    if len(runs) > 1:
        for key in ("prompt_tokens_per_second", "measured_tokens_per_second"):
            h[key], h[key + "_sd"] = mean_sd([r[key] for r in runs])
    h["runs"] = [r["measured_tokens_per_second"] for r in runs]
    return h
hyp = {case: merged(runs) for case, runs in by_case.items()}
lb_runs = {}
for r in rows:
    if r["engine"] == "llama.cpp loop":
        # The plain llama.cpp loop (`vsloop`): a decode case beside llama-bench's.
        r = {**r, "kind": "decode", "avg_ts": r["tokens_per_second"], "args": f"{r['sampler']} argmax",
             "stddev_ts": mean_sd(r["runs"])[1] if len(r["runs"]) > 1 else 0.0, "cgroup_peak_bytes": None}
    if r["engine"] in ("llama-bench", "llama.cpp loop"):
        lb_runs.setdefault((r["case"], r["kind"]), []).append(r)
# A llama-bench case run in several rounds: the mean of its rounds, the sd
# between them; each round's rate in "runs".
lb = {}
for (case, kind), runs in lb_runs.items():
    b = dict(runs[-1])
    xs = [r["avg_ts"] for r in runs]
    if len(xs) > 1:
        b["avg_ts"], b["stddev_ts"] = mean_sd(xs)
    b["runs"] = xs
    lb.setdefault(case, {})[kind] = b
# Which llama-bench case each hypura case stands beside.
best_ncmoe = max((v["decode"]["avg_ts"], k) for k, v in lb.items() if k.startswith("mixtral-ncmoe") and "decode" in v)[1] \
    if any(k.startswith("mixtral-ncmoe") for k in lb) else None
# (hypura case, phase) -> the llama-bench case beside it.
tg = "dense-tg" if "dense-tg" in lb else "dense-all-gpu"
beside = {("dense-tg128", "decode"): tg, ("dense-tg128-host-argmax", "decode"): tg,
          ("dense-pp512-tg128", "prompt"): "dense-all-gpu", ("dense-pp512-tg128", "decode"): "dense-d512",
          ("dense-all-gpu", "prompt"): "dense-all-gpu", ("dense-all-gpu", "decode"): "dense-all-gpu"}
for case in ("mixtral-8g-12g", "mixtral-8g-12g-cgroup"):
    beside[(case, "decode")] = best_ncmoe
fmt = lambda m, s: f"{m:9.2f} ± {s:6.2f}"
print(f"{'case':22} {'phase':7} {'hypura tok/s':>18} {'llama-bench tok/s':>18} {'ratio':>6}")
for case, h in hyp.items():
    for kind, key in (("prompt", "prompt_tokens_per_second"), ("decode", "measured_tokens_per_second")):
        hv, hs = h[key], h.get(key + "_sd", 0.0)
        b = lb.get(beside.get((case, kind)), {}).get(kind)
        lv = fmt(b["avg_ts"], b["stddev_ts"]) if b else " " * 18
        ratio = f"{hv / b['avg_ts']:6.3f}" if b else "      "
        pk = {"prompt": "predicted_prompt_tokens_per_second", "decode": "predicted_tokens_per_second"}[kind]
        planner = f"  planner {h[pk]:.2f} ({(h[pk] - hv) / hv * 100:+.0f}%)" if h.get(pk) and hv else ""
        print(f"{case:22} {kind:7} {fmt(hv, hs)} {lv} {ratio}{planner}")
    t = h.get("tier_bytes", {})
    st = h.get("stream", {})
    print(f"{'':22} plan: {h['mode']}, GPU {t.get('gpu', 0) / 1e9:.2f} GB, RAM {t.get('ram', 0) / 1e9:.2f} GB, "
          f"STREAM {t.get('stream', 0) / 1e9:.2f} GB (cache {h.get('stream_cache_bytes', 0) / 1e9:.2f} GB), "
          f"predicted {h['predicted_tokens_per_second']:.2f} tok/s; peak RSS {h['peak_rss_kib'] * 1024 / 1e9:.2f} GB")
    if h["mode"] != "full-resident":
        print(f"{'':22} stream: hit rate {st.get('hit_rate', 0):.2f}, {st.get('nvme_bytes_per_token', 0) / 1e9:.2f} GB/token "
              f"at {st.get('read_gbps', 0):.2f} GB/s, stall {st.get('io_stall_seconds_per_token', 0) * 1e3:.0f} ms/token, "
              f"{st.get('resident_layer_skips_per_token', 0):.1f} layers/token not asked")
for case, kinds in lb.items():
    for kind, b in kinds.items():
        print(f"{b['engine']} {case} {kind}: {fmt(b['avg_ts'], b['stddev_ts'])} ({b['args']}; cgroup peak {b['cgroup_peak_bytes']})")
def pair(a, b, what):
    if a in hyp and b in hyp:
        x, y = hyp[a]["measured_tokens_per_second"], hyp[b]["measured_tokens_per_second"]
        runs = lambda c: ", ".join(f"{v:.2f}" for v in hyp[c]["runs"])
        print(f"{what}: {x:.2f} vs {y:.2f} tok/s = {x / y:.3f} (mean of {len(hyp[a]['runs'])} and "
              f"{len(hyp[b]['runs'])} alternated runs: {runs(a)} vs {runs(b)})")
if "dense-tg128" in hyp:
    hr = hyp["dense-tg128"]
    h = hr["measured_tokens_per_second"]
    for case in ("dense-tg", "dense-tg-t1", "dense-loop-device", "dense-loop-host", "dense-all-gpu", "dense-all-gpu-t1"):
        b = lb.get(case, {}).get("decode")
        if b:
            rounds = ""
            if len(b["runs"]) == len(hr["runs"]) > 1:
                rounds = " (by round: " + ", ".join(f"{x / y:.3f}" for x, y in zip(hr["runs"], b["runs"])) + ")"
            print(f"single stream, all on the GPU: hypura tg128 {h:.2f} / {b['engine']} {case} ({b['args']}) "
                  f"{b['avg_ts']:.2f} = {h / b['avg_ts']:.3f}{rounds}")
pair("moe-cached-gpu400MiB", "moe-ram-gpu400MiB", "all-cached streaming / experts in RAM, with the GPU")
pair("moe-cached-gpu0", "moe-ram-gpu0", "all-cached streaming / experts in RAM, CPU only")
serve = os.path.join(os.path.dirname(sys.argv[2]), "serve.jsonl")
if os.path.exists(serve):
    runs = [json.loads(l) for l in open(serve)]
    by_n = {}
    for r in runs:
        by_n.setdefault(r["clients"], []).append(r)
    for n, rs in sorted(by_n.items()):
        best = max((r for r in rs if r["label"].startswith("llama-server")), key=lambda r: r["tokens_per_second"], default=None)
        for r in rs:
            ratio = f" = {r['tokens_per_second'] / best['tokens_per_second']:.2f}x the best llama-server" \
                if best and r["label"].startswith("hypura") and best["tokens_per_second"] else ""
            print(f"serve N={n:3} {r['label']:28} {r['tokens_per_second']:9.1f} tok/s, TTFT p50 {r['ttft_p50_ms']} ms, "
                  f"p95 {r['ttft_p95_ms']} ms, {r['requests']} requests, {r['failures']} failed{ratio}")
par = [h for c, h in hyp.items() if c.startswith("dense-parallel")]
for h in par:
    print(f"hypura bench --parallel {h['parallel']:3} ({h.get('argmax')} argmax): {h['step_ms']:.2f} ms per step, "
          f"{h['measured_tokens_per_second']:.1f} tok/s together")
if os.path.exists(sys.argv[2]):
    for l in open(sys.argv[2]):
        r = json.loads(l)
        if r.get("case") == "hostmem-mixtral-8g-12g" and "tokens_per_second" in r:
            best = max((v["decode"]["avg_ts"], k) for k, v in lb.items() if k.startswith("mixtral-ncmoe") and "decode" in v) \
                if any(k.startswith("mixtral-ncmoe") for k in lb) else None
            ratio = f", {r['tokens_per_second'] / best[0]:.2f}x llama-bench {best[1]} ({best[0]:.3f})" if best else ""
            print(f"hostmem: Mixtral 8 GiB GPU + 12 GiB RAM in a cgroup of budget + overhead "
                  f"({r['memory_max_bytes'] / 1e9:.2f} GB): {r['tokens_per_second']:.3f} tok/s{ratio}; peak RSS "
                  f"{r['peak_rss_bytes'] / 1e9:.2f} GB, cgroup peak {r['cgroup_memory_peak_bytes'] / 1e9:.2f} GB, "
                  f"OOM kills {r['oom_kills']}, within: {r.get('within')}")
        if r.get("case") == "servemix":
            print(f"servemix ({r['flags']}): {r['tokens_per_second']:.3f} tok/s, "
                  + "; ".join(p["line"][:160] for p in r["placements"]))
    res = {}
    for l in open(sys.argv[2]):
        r = json.loads(l)
        res.setdefault(r["case"], []).append(r)
    if "hybrid-stream" in res and "hybrid-ram" in res:
        a, b = res["hybrid-stream"][0]["tokens"], res["hybrid-ram"][0]["tokens"]
        n = next((i for i, (p, q) in enumerate(zip(a, b)) if p != q), None)
        print("GPU exactness, hybrid (experts streamed) vs the same GPU tensors with experts in RAM: "
              + (f"identical ({len(a)} tokens)" if n is None else f"differ from token {n}"))
EOF
}

# Host memory inside the RAM budget (issue 14, Deliver 2): hypura bench on the
# full Mixtral shape with --gpu-budget 8GiB --ram-budget 12GiB inside a cgroup
# v2 of memory.max = the RAM budget + the host overhead `hypura profile`
# measures here (a quick profile in its own cache dir; planning uses $PROFILE
# with that overhead added, else the quick profile). One line in results.jsonl:
# memory.peak (page cache included), oom kills, the process's VmHWM, tok/s.
# The host overhead (`hypura profile --quick`) into $W/hostmem-profile.json
# and $W/hostmem-overhead.
hostmem_profile() {
  local cache=$W/hostmem-cache prof=$W/hostmem-profile.json overhead
  mkdir -p "$cache"
  log "hostmem: measuring the host overhead (hypura profile --quick)"
  HYPURA_CACHE_DIR=$cache "$H" profile --json --refresh --quick --path "$W" >"$W/hostmem-quick.json" 2>>"$W/stderr.txt" \
    || { log "hostmem: profile failed"; return 1; }
  python3 - "${PROFILE:-$W/hostmem-quick.json}" "$W/hostmem-quick.json" "$prof" <<'EOF' | tee -a "$OUT/log.txt"
import json, sys
base, quick = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
base["host_overhead"] = quick["host_overhead"]
json.dump(base, open(sys.argv[3], "w"))
print("host overhead:", json.dumps(quick["host_overhead"]))
EOF
  overhead=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["host_overhead"]["after_devices_bytes"])' "$prof") || return 1
  echo "$overhead" >"$W/hostmem-overhead"
}

hostmem() {
  late hostmem && return 0
  local budget=${HOSTMEM_RAM_BYTES:-12884901888} prof=$W/hostmem-profile.json
  local cg=/sys/fs/cgroup/hypura-hostmem overhead
  [ -f "$prof" ] || hostmem_profile || return 1
  overhead=$(cat "$W/hostmem-overhead")
  rmdir "$cg" 2>/dev/null
  cgroup_at "$cg" $((budget + overhead)) || { log "hostmem skipped"; return 1; }
  drop_caches
  log "hostmem: hypura bench $MOEFULL --gpu-budget 8GiB --ram-budget $budget in $cg"
  python3 - "$cg" "$budget" "$overhead" sh -c "echo \$\$ > $cg/cgroup.procs && exec \"\$@\"" sh \
    "$H" bench "$MOEFULL" --json --threads "$T" --profile "$prof" --gpu-budget 8GiB --ram-budget "$budget" \
    --prompt-tokens 16 --tokens "${MIX_TOKENS:-32}" --repetitions 1 >>"$OUT/results.jsonl" 2>"$W/err.txt" <<'EOF'
import json, resource, subprocess, sys
cg, budget, overhead, cmd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
r = subprocess.run(cmd, capture_output=True, text=True)
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
read = lambda f: open(f"{cg}/{f}").read()
events = dict(l.split() for l in read("memory.events").splitlines())
line = {"case": "hostmem-mixtral-8g-12g", "engine": "hypura", "returncode": r.returncode,
        "ram_budget_bytes": budget, "overhead_bytes": overhead, "memory_max_bytes": budget + overhead,
        "cgroup_memory_peak_bytes": int(read("memory.peak")), "oom_kills": int(events.get("oom_kill", 0)),
        "peak_rss_bytes_rusage": rss}
if r.returncode == 0:
    j = json.loads(r.stdout)
    h = j["host_memory"]
    line.update(peak_rss_bytes=h["peak_rss_bytes"], tokens_per_second=j["measured_tokens_per_second"],
                stream_cache_bytes=j["stream_cache_bytes"], tier_bytes=j["tier_bytes"], host_memory=h,
                within=max(h["peak_rss_bytes"], rss) <= budget + overhead)
else:
    sys.stderr.write(r.stderr[-2000:])
print(json.dumps(line))
EOF
  tail -1 "$OUT/results.jsonl" | cut -c1-900 | tee -a "$OUT/log.txt"
  rmdir "$cg" 2>/dev/null
  return 0
}

# What the cgroup holds when hypura runs the full Mixtral shape at the whole
# 12 GiB budget: memory.max = budget + overhead + HOSTMEM_SLACK (default 1
# GiB, so that nothing is OOM-killed), memory.stat and /proc/PID/status
# sampled every 50 ms (scripts/bench/cgroup_watch.py).
hostmemwatch() {
  late hostmemwatch && return 0
  local budget=${HOSTMEM_RAM_BYTES:-12884901888} cg=/sys/fs/cgroup/hypura-watch overhead prof=$W/hostmem-profile.json
  [ -f "$prof" ] || hostmem_profile || return 1
  overhead=$(cat "$W/hostmem-overhead")
  rmdir "$cg" 2>/dev/null
  cgroup_at "$cg" $((budget + overhead + ${HOSTMEM_SLACK:-1073741824})) || return 1
  drop_caches
  log "hostmemwatch: hypura bench $MOEFULL --gpu-budget 8GiB --ram-budget $budget (limit+overhead $((budget + overhead)))"
  python3 scripts/bench/cgroup_watch.py "$cg" -- "$H" bench "$MOEFULL" --json --threads "$T" --profile "$prof" \
    --gpu-budget 8GiB --ram-budget "$budget" --prompt-tokens 16 --tokens "${MIX_TOKENS:-32}" --repetitions 1 \
    2>"$W/err.txt" | python3 -c 'import json,sys; j=json.load(sys.stdin); j["case"]="hostmemwatch"; print(json.dumps(j))' >>"$OUT/results.jsonl"
  tail -1 "$OUT/results.jsonl" | cut -c1-3000 | tee -a "$OUT/log.txt"
  tail -3 "$W/err.txt" | tee -a "$OUT/log.txt"
  rmdir "$cg" 2>/dev/null
  return 0
}

for step in "$@"; do
  if [ "$step" = build ]; then build || { log "build failed"; exit 1; }; else "$step" || log "step $step: last command failed"; fi
done
log "done"
