//! `hypura serve --config FILE`: a TOML file names the models and sets the
//! server; flags override it; a bad file stops start-up naming the key.
#[path = "../common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::Server;
use serde_json::{json, Value};

/// Writes `text` as `NAME.toml` in a directory of this test's own.
fn write_config(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hypura-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// `[[models]]` naming SmolLM2 as `name`.
fn smol_entry(name: &str) -> String {
    format!(
        "[[models]]\nname = \"{name}\"\npath = {:?}\n",
        common::smollm2().to_str().unwrap()
    )
}

/// Runs `hypura serve --config PATH --port 0`, expecting it to fail; its stderr.
fn start_fails(config: &Path) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_hypura"))
        .args(["serve", "--config", config.to_str().unwrap(), "--port", "0"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{config:?}");
    String::from_utf8(output.stderr).unwrap()
}

#[test]
fn serves_the_configured_models_with_their_settings() {
    // Port 1 would need root: the flag's port 0 must win.
    let config = write_config(
        "good",
        &format!(
            "[server]\nport = 1\ncontext = 2048\n\n{}\
             keep_alive = \"-1\"\npin = \"full\"\npriority = 10\ncontext = 256\nparallel = 2\n",
            smol_entry("smol:test")
        ),
    );
    let s = Server::start_with(&[
        "serve".into(),
        "--config".into(),
        config.to_string_lossy().into_owned(),
        "--port".into(),
        "0".into(),
    ]);
    let tags: Value = s.get("/api/tags").json().unwrap();
    let names: Vec<&Value> = tags["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| &m["name"])
        .collect();
    assert_eq!(names, [&json!("smol:test")]);

    let body = json!({"model": "smol:test", "prompt": "Hi", "stream": false,
        "options": {"temperature": 0, "num_predict": 2}});
    let done = s.post_json("/api/generate", body, 200);
    assert_eq!(done["done"], true);
    let ps: Value = s.get("/api/ps").json().unwrap();
    let loaded = &ps["models"][0];
    assert_eq!(loaded["name"], "smol:test");
    // The model's own context, not the server's.
    assert_eq!(loaded["context_length"], 256);
    // keep_alive "-1": never unloaded.
    assert_eq!(loaded["expires_at"], "2286-11-20T17:46:40.000000000Z");
}

#[test]
fn bad_configs_stop_start_up_naming_the_key() {
    let smol = common::smollm2();
    let cases = [
        (
            "unknown-key",
            "[server]\nprot = 8080\n".to_string(),
            "server.prot: unknown field `prot`, expected one of `host`, `port`, `api_key`, \
             `context`, `parallel`, `queue_limit`, `batch`, `threads`, `keep_alive`, \
             `demote_after`, `max_body_bytes`, `body_memory`, `body_timeout`, \
             `max_connections`, `max_connections_per_ip`, `models_dir`, `gpu_budget`, `ram_budget`, \
             `metrics_open_on_loopback`, `admin_key`, `insecure_no_auth`, `allowed_origins`, \
             `allowed_hosts`, `model_roots`, `pull_hosts`, `pull_allow_private`, \
             `pull_max_bytes`, `in_process`, `default_max_tokens`, `prompt_cache_ram`, \
             `prompt_cache_disk`, `idle_slots`, `keys_file` (line 2)"
                .to_string(),
        ),
        (
            "bad-size",
            "[server]\ngpu_budget = \"16 GiBs\"\n".to_string(),
            "server.gpu_budget: '16 GiBs': unknown unit 'gibs' (use B, KiB, MiB, GiB, TiB, kB, \
             MB, GB or TB)"
                .to_string(),
        ),
        (
            "missing-model",
            "[[models]]\nname = \"gone\"\npath = \"/nonexistent/gone.gguf\"\n".to_string(),
            "models[0].path: /nonexistent/gone.gguf does not exist: check the path (relative \
             paths start at the configuration file's directory)"
                .to_string(),
        ),
        (
            "duplicate-names",
            format!("{}{}", smol_entry("smol:test"), smol_entry("Smol:Test")),
            "models[1].name: \"Smol:Test\" is also the name of models[0]; give each model its \
             own name"
                .to_string(),
        ),
        (
            "bad-pin",
            format!("{}pin = \"half\"\n", smol_entry("smol:test")),
            "models[0].pin: unknown variant `half`, expected one of `none`, `streaming`, \
             `partial`, `full` (line 4)"
                .to_string(),
        ),
    ];
    for (name, text, message) in cases {
        let config = write_config(name, &text);
        let stderr = start_fails(&config);
        assert_eq!(
            stderr,
            format!("error: {}: {message}\n", config.display()),
            "{name}"
        );
    }
    assert!(smol.is_file());
}
