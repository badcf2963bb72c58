// A plain llama.cpp decode loop, the baseline `scripts/bench-decode.sh` compares
// hypura against: tokenize, decode the prompt, then greedy-decode N tokens one
// at a time, timing the prompt and the generation separately. Built against
// the same static llama.cpp libraries hypura links, with the same flags.
//
// Environment:
//   LOOP_SAMPLER=device  take the argmax with llama.cpp's own greedy sampler
//                        inside the decode graph (its backend sampling), not on
//                        the host from the copied logits
//   LOOP_WARMUP=1        first an untimed run of the prompt and 8 tokens
//                        (first-use costs out of the figures, as llama-bench)
//   LOOP_REPS=N          N timed runs (at most 64), each from an empty KV
//                        cache: the figures are their means, each run's rate
//                        in "runs"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llama.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void quiet(enum ggml_log_level level, const char * text, void * data) {
    (void) data;
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

int main(int argc, char ** argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s MODEL PROMPT N_TOKENS N_THREADS [N_GPU_LAYERS] [read|mmap] [CPU_REGEX]\n", argv[0]);
        return 2;
    }
    const char * path = argv[1];
    const char * prompt = argv[2];
    int n_gen = atoi(argv[3]);
    int n_threads = atoi(argv[4]);
    int n_gpu = argc > 5 ? atoi(argv[5]) : 0;
    int use_mmap = argc > 6 && strcmp(argv[6], "mmap") == 0;
    // Tensors matching CPU_REGEX stay in host RAM (llama-bench's `-ot REGEX=CPU`).
    const char * cpu_regex = argc > 7 ? argv[7] : NULL;

    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = n_gpu;
    mp.load_mode = use_mmap ? LLAMA_LOAD_MODE_MMAP : LLAMA_LOAD_MODE_NONE;
    // With mmap, CPU repacking would copy every weight into anonymous memory:
    // keep weights in the page cache, as a memory-limited mmap user would.
    if (use_mmap) mp.use_extra_bufts = false;
    struct llama_model_tensor_buft_override overrides[2] = {{0}};
    if (cpu_regex) {
        overrides[0].pattern = cpu_regex;
        overrides[0].buft = ggml_backend_cpu_buffer_type();
        mp.tensor_buft_overrides = overrides;
    }
    struct llama_model * model = llama_model_load_from_file(path, mp);
    if (!model) { fprintf(stderr, "cannot load %s\n", path); return 1; }
    const struct llama_vocab * vocab = llama_model_get_vocab(model);

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 4096;
    cp.n_batch = 512;
    cp.n_ubatch = 512;
    cp.n_threads = n_threads;
    cp.n_threads_batch = n_threads;
    struct llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "cannot create a context\n"); return 1; }

    llama_token tokens[4096];
    int n_prompt = llama_tokenize(vocab, prompt, (int) strlen(prompt), tokens, 4096, true, true);
    if (n_prompt <= 0) { fprintf(stderr, "tokenize failed\n"); return 1; }
    int n_vocab = llama_vocab_n_tokens(vocab);
    const char * sampler_env = getenv("LOOP_SAMPLER");
    const int on_device = sampler_env && strcmp(sampler_env, "device") == 0;
    if (on_device) {
        struct llama_sampler * chain = llama_sampler_chain_init(llama_sampler_chain_default_params());
        llama_sampler_chain_add(chain, llama_sampler_init_greedy());
        if (!llama_set_sampler(ctx, 0, chain)) { fprintf(stderr, "no backend sampling here\n"); return 1; }
    }
    const char * warmup_env = getenv("LOOP_WARMUP");
    if (warmup_env && atoi(warmup_env)) {
        if (llama_decode(ctx, llama_batch_get_one(tokens, n_prompt)) != 0) return 1;
        for (int k = 0; k < 8; k++) {
            llama_token t = on_device ? llama_get_sampled_token_ith(ctx, -1) : 0;
            if (llama_decode(ctx, llama_batch_get_one(&t, 1)) != 0) return 1;
        }
        llama_synchronize(ctx);
        llama_memory_clear(llama_get_memory(ctx), true);
    }

    const char * reps_env = getenv("LOOP_REPS");
    int reps = reps_env && atoi(reps_env) > 0 ? atoi(reps_env) : 1;
    if (reps > 64) reps = 64;
    double prompt_sum = 0, gen_sum = 0, runs[64];
    int generated = 0;
    llama_token * out = calloc(n_gen > 0 ? n_gen : 1, sizeof(llama_token));
    for (int rep = 0; rep < reps; rep++) {
        if (rep > 0) llama_memory_clear(llama_get_memory(ctx), true);
        double t0 = now_s();
        if (llama_decode(ctx, llama_batch_get_one(tokens, n_prompt)) != 0) return 1;
        double t_prompt = now_s() - t0;

        generated = 0;
        double t_first = 0;
        llama_token next = 0;
        for (; generated < n_gen; generated++) {
            int best = 0;
            if (on_device) {
                best = llama_get_sampled_token_ith(ctx, -1);
            } else {
                const float * logits = llama_get_logits_ith(ctx, -1);
                for (int i = 1; i < n_vocab; i++) if (logits[i] > logits[best]) best = i;
            }
            next = best;
            out[generated] = best;
            if (generated == 0) t_first = now_s();
            if (generated + 1 == n_gen) { generated++; break; }
            if (llama_decode(ctx, llama_batch_get_one(&next, 1)) != 0) return 1;
        }
        double t_gen = now_s() - t_first;
        prompt_sum += n_prompt / t_prompt;
        // Same accounting as hypura's `tokens_per_second`: tokens after the first
        // (which comes from the prompt's logits) over the time spent decoding them.
        runs[rep] = (generated - 1) / t_gen;
        gen_sum += runs[rep];
    }
    printf("{\"prompt_tokens\":%d,\"prompt_tokens_per_second\":%.2f,\"generated_tokens\":%d,\"tokens_per_second\":%.2f,"
           "\"sampler\":\"%s\",\"runs\":[",
           n_prompt, prompt_sum / reps, generated, gen_sum / reps, on_device ? "device" : "host");
    for (int r = 0; r < reps; r++) printf(r ? ",%.2f" : "%.2f", runs[r]);
    printf("],\"tokens\":[");
    for (int i = 0; i < generated; i++) printf(i ? ",%d" : "%d", out[i]);
    printf("]}\n");
    free(out);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
