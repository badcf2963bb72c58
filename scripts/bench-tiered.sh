#!/usr/bin/env bash
# Streaming benchmark (not a test): a model several times the RAM budget,
# decoded by hypura in its streaming mode, next to
#   - hypura full-resident (no budget) on the same file,
#   - llama.cpp's own mmap load under the same memory (a cgroup v2 memory.max,
#     which also caps its page cache), when cgroups are writable (root),
#   - the I/O bound: measured O_DIRECT read bandwidth / bytes read per token.
#
#   scripts/bench-tiered.sh MODEL RAM_BUDGET [N_TOKENS] [THREADS]
#   e.g. scripts/bench-tiered.sh /tmp/mixtral-4l.gguf 1GiB 32
#
# SKIP_BUILD=1 uses target/release/{hypura,llama-decode-bench} as they are.
set -euo pipefail
cd "$(dirname "$0")/.."
model="$1"; budget="$2"; n="${3:-32}"; threads="${4:-$(nproc)}"
prompt="The history of the city of Paris begins"
bench=target/release/llama-decode-bench
if [ "${SKIP_BUILD:-0}" != 1 ]; then SKIP_BUILD=0 scripts/bench-decode.sh "$model" 2 1 >/dev/null; fi

cache_dropped=yes
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || cache_dropped=no; }
field() { python3 -c "import json,sys; d=json.load(sys.stdin); print(d$1)"; }

size=$(stat -c %s "$model")
# O_DIRECT sequential read bandwidth of the volume holding the model.
drop_caches
bw=$(dd if="$model" of=/dev/null bs=4M iflag=direct count=256 2>&1 | awk '/copied/ {print $(NF-1), $NF}')
bw_gbs=$(python3 -c "v,u='$bw'.split(); v=float(v); print(v if u.startswith('GB') else v/1000 if u.startswith('MB') else v*1.073741824 if u.startswith('GiB') else v/1e6)")

run_hypura() {
  drop_caches
  target/release/hypura run "$model" --raw --prompt "$prompt" --temperature 0 --max-tokens "$n" --threads "$threads" --json "$@" 2>/dev/null
}
full=$(run_hypura --mode full-resident)
stream=$(run_hypura --ram-budget "$budget")
full_tps=$(echo "$full" | field '["stats"]["tokens_per_second"]')
s_tps=$(echo "$stream" | field '["stats"]["tokens_per_second"]')
s_mode=$(echo "$stream" | field '["stats"]["mode"]')
s_bytes=$(echo "$stream" | field '["stats"]["nvme_bytes_read"]')
s_gen=$(echo "$stream" | field '["generated_tokens"]')
s_hits=$(echo "$stream" | field '["stats"]["expert_hits"]')
s_miss=$(echo "$stream" | field '["stats"]["expert_misses"]')
s_pf=$(echo "$stream" | field '["stats"]["prefetch_hits"]')
s_same=$(python3 -c "import json; a=json.loads('''$full'''); b=json.loads('''$stream'''); print(a['tokens']==b['tokens'])")

budget_bytes=$(python3 -c "
u={'k':1<<10,'m':1<<20,'g':1<<30,'kib':1<<10,'mib':1<<20,'gib':1<<30}
import re; m=re.match(r'([0-9.]+)\s*([a-zA-Z]*)','$budget'); print(int(float(m[1])*u.get(m[2].lower(),1)))")

mmap_tps="n/a (cgroup not writable)"
cg=/sys/fs/cgroup/hypura-bench-$$
if mkdir "$cg" 2>/dev/null; then
  echo "$budget_bytes" > "$cg/memory.max"
  drop_caches
  out=$(bash -c "echo \$\$ > $cg/cgroup.procs && grep -q hypura-bench /proc/self/cgroup || { echo 'cannot join the cgroup'; exit 97; }; exec $bench '$model' '$prompt' $n $threads 0 mmap" 2>&1 || true)
  mmap_tps=$(echo "$out" | tail -1 | field '["tokens_per_second"]' 2>/dev/null || echo "failed: $(echo "$out" | tail -2 | tr '\n' ' ')")
  rmdir "$cg" 2>/dev/null || true
  # A page cache we could not drop (no root) still holds the file: the mmap
  # run then measures memory, not the memory limit.
  [ "$cache_dropped" = yes ] || mmap_tps="$mmap_tps (invalid: page cache could not be dropped)"
fi

python3 - <<PY
size=$size; budget=$budget_bytes; gen=$s_gen; nbytes=$s_bytes; bw=$bw_gbs*1e9
per_tok = nbytes/max(gen,1)
io_bound = bw/per_tok if per_tok else float('inf')
full=$full_tps; s=$s_tps
lower = min(io_bound, full)
print(f"model {size/2**30:.2f} GiB, RAM budget {budget/2**30:.2f} GiB ({size/budget:.1f}x), {gen} tokens, $threads threads")
print(f"O_DIRECT read bandwidth        {bw/1e9:.2f} GB/s")
print(f"hypura full-resident           {full:.2f} tok/s")
print(f"hypura $s_mode  {s:.2f} tok/s  (tokens identical to full-resident: $s_same)")
print(f"  read per token               {per_tok/1e6:.1f} MB, hits {$s_hits} misses {$s_miss} prefetch hits {$s_pf}")
print(f"  I/O bound                    {io_bound:.2f} tok/s")
print(f"  ratio to min(I/O bound, full) {s/lower:.2f}")
print(f"llama.cpp mmap, same memory     $mmap_tps tok/s")
PY
