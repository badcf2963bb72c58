//! Conformance with the Gateway API Inference Extension's model-server
//! protocol (`docs/proposals/003-model-server-protocol` of
//! kubernetes-sigs/gateway-api-inference-extension), as far as one server
//! can show it: the OpenAI Completions and Chat APIs answer by the `model`
//! field; `/metrics` has, per loaded model (label `model_name`), the gauges
//! TotalQueuedRequests (`vllm:num_requests_waiting`), TotalRunningRequests
//! (`vllm:num_requests_running`) and KVCacheUtilization
//! (`vllm:kv_cache_usage_perc`, 0 to 1), the optional
//! `vllm:cache_config_info{block_size,num_gpu_blocks}` and the LoRA info
//! gauge `vllm:lora_requests_info{max_lora,running_lora_adapters,waiting_lora_adapters}`
//! (its value a timestamp); the readiness probe answers 200; requests
//! waiting at the fair queue are counted as queued.
#[path = "../common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{client, wait_until, Server, MODEL};
use serde_json::json;

/// The `/metrics` samples of `name`: labels → value.
fn samples(text: &str, name: &str) -> Vec<(HashMap<String, String>, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let (labels, value) = match rest.strip_prefix('{') {
                Some(r) => {
                    let (labels, value) = r.split_once("} ")?;
                    (labels, value)
                }
                None => ("", rest.strip_prefix(' ')?),
            };
            let labels = labels
                .split("\",")
                .filter(|p| !p.is_empty())
                .filter_map(|p| {
                    let (k, v) = p.split_once("=\"")?;
                    Some((k.to_string(), v.trim_end_matches('"').to_string()))
                })
                .collect();
            Some((labels, value.trim().parse().ok()?))
        })
        .collect()
}

fn type_of(text: &str, name: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("# TYPE {name} ")))
        .map(str::to_string)
}

#[test]
fn hypura_exports_what_an_inference_gateway_endpoint_picker_reads() {
    let server = Server::start(&["--parallel", "1"]);
    assert_eq!(server.get("/ready").status(), 200);
    // Both OpenAI APIs, routed by the `model` field.
    let chat = server.post_json(
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
        200,
    );
    assert_eq!(chat["object"], "chat.completion");
    let text = server.post_json(
        "/v1/completions",
        json!({"model": MODEL, "prompt": "hi", "max_tokens": 2}),
        200,
    );
    assert_eq!(text["object"], "text_completion");

    let metrics = server.get("/metrics").text().unwrap();
    for name in [
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "vllm:cache_config_info",
        "vllm:lora_requests_info",
    ] {
        assert_eq!(type_of(&metrics, name).as_deref(), Some("gauge"), "{name}");
    }
    let one = |name: &str| {
        let s = samples(&metrics, name);
        assert_eq!(s.len(), 1, "{name}: {s:?}");
        assert_eq!(
            s[0].0.get("model_name").map(String::as_str),
            Some(MODEL),
            "{name}"
        );
        s[0].1
    };
    assert_eq!(one("vllm:num_requests_waiting"), 0.0);
    assert_eq!(one("vllm:num_requests_running"), 0.0);
    let usage = one("vllm:kv_cache_usage_perc");
    assert!((0.0..=1.0).contains(&usage), "{usage}");
    assert_eq!(one("vllm:gpu_cache_usage_perc"), usage);
    let config = samples(&metrics, "vllm:cache_config_info");
    assert_eq!(config[0].0["block_size"], "1");
    assert!(config[0].0["num_gpu_blocks"].parse::<u64>().unwrap() > 0);
    let lora = samples(&metrics, "vllm:lora_requests_info");
    assert_eq!(lora.len(), 1);
    assert_eq!(lora[0].0["max_lora"], "0");
    assert_eq!(lora[0].0["running_lora_adapters"], "");
    assert_eq!(lora[0].0["waiting_lora_adapters"], "");
    assert!(lora[0].1 > 1.7e9, "a Unix timestamp: {}", lora[0].1);

    // A request waiting for the one slot is TotalQueuedRequests, one
    // generating TotalRunningRequests.
    let long = |url: String| {
        std::thread::spawn(move || {
            client()
                .post(format!("{url}/v1/completions"))
                .json(&json!({"model": MODEL, "prompt": "Count to one hundred:", "max_tokens": 200, "temperature": 0}))
                .send()
                .unwrap()
                .status()
        })
    };
    let first = long(server.base.clone());
    let second = long(server.base.clone());
    wait_until(Duration::from_secs(60), "one running, one queued", || {
        let m = server.get("/metrics").text().unwrap();
        let get = |n: &str| samples(&m, n).first().map(|s| s.1);
        get("vllm:num_requests_running") == Some(1.0)
            && get("vllm:num_requests_waiting") == Some(1.0)
    });
    assert_eq!(first.join().unwrap(), 200);
    assert_eq!(second.join().unwrap(), 200);
}
