//! The client commands (`ps`, `list`, `pull`, `show`, `stop`, `run NAME`)
//! against a live `hypura serve` of SmolLM2: exact columns and values, as
//! the server's own routes report them.
#[path = "../common/mod.rs"]
mod common;

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{smollm2, wait_until, Server, MODEL};
use serde_json::{json, Value};

/// `hypura ARGS` with `HYPURA_HOST` set to `host` (`None`: unset) and
/// `OLLAMA_HOST` to `ollama_host`.
fn hypura_at(host: Option<&str>, ollama_host: Option<&str>, args: &[&str], stdin: &str) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hypura"));
    cmd.args(args)
        .env_remove("HYPURA_HOST")
        .env_remove("OLLAMA_HOST")
        .env_remove("HYPURA_API_KEY")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(host) = host {
        cmd.env("HYPURA_HOST", host);
    }
    if let Some(host) = ollama_host {
        cmd.env("OLLAMA_HOST", host);
    }
    let mut child = cmd.spawn().expect("spawn hypura");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// `hypura ARGS` against `server`; asserts success; its stdout.
fn ok(server: &Server, args: &[&str]) -> String {
    let out = hypura_at(Some(&server.base), None, args, "");
    assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    text(&out.stdout)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Ollama's format.HumanBytes, written again here so that a change there is caught.
fn human_bytes(b: u64) -> String {
    let (value, unit) = match b {
        1_000_000_000_000.. => (b as f64 / 1e12, "TB"),
        1_000_000_000.. => (b as f64 / 1e9, "GB"),
        1_000_000.. => (b as f64 / 1e6, "MB"),
        1_000.. => (b as f64 / 1e3, "KB"),
        _ => return format!("{b} B"),
    };
    if value >= 10.0 || value.fract() == 0.0 {
        format!("{} {unit}", value as u64)
    } else {
        format!("{value:.1} {unit}")
    }
}

/// Ollama's PROCESSOR column.
fn processor(size: u64, vram: u64) -> String {
    match (size, vram) {
        (_, 0) => "100% CPU".into(),
        (s, v) if s == v => "100% GPU".into(),
        (s, v) if v > s => "Unknown".into(),
        (s, v) => {
            let cpu = ((s - v) as f64 / s as f64 * 100.0).round() as u64;
            format!("{cpu}%/{}% CPU/GPU", 100 - cpu)
        }
    }
}

/// The cells of a table row: columns are separated by at least two spaces
/// (cells hold single spaces: `98 MB`, `4 minutes from now`).
fn cells(line: &str) -> Vec<String> {
    line.split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(str::to_string)
        .collect()
}

const PS_HEADER: &str = "NAME    ID    SIZE    PROCESSOR    RESIDENCY    GPU    RAM    STREAM    SLOTS    TOK/S    CONTEXT    UNTIL";

#[test]
fn ps_list_show_run_stop_read_the_server() {
    let server = Server::start(&[]);
    // GPU by default: the start-up log names the GPU budget in force.
    let log = server.log();
    assert!(
        log.contains("hypura: no GPU found: CPU only")
            || log.contains(
                "(default: free memory less 1.0 GiB per device; --gpu-budget 0 for CPU only) on "
            ),
        "{log}"
    );

    // Nothing loaded yet: the header alone, columns four spaces apart.
    assert_eq!(ok(&server, &["ps"]), format!("{PS_HEADER}\n"));

    let tags: Value = server.get("/api/tags").json().unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&ok(&server, &["list", "--json"])).unwrap(),
        tags
    );
    let listed = ok(&server, &["ls"]);
    let lines: Vec<&str> = listed.lines().collect();
    assert_eq!(lines.len(), 2, "{listed}");
    assert_eq!(cells(lines[0]), ["NAME", "ID", "SIZE", "MODIFIED"]);
    let row = cells(lines[1]);
    let digest = tags["models"][0]["digest"].as_str().unwrap();
    let digest = digest.strip_prefix("sha256:").unwrap_or(digest);
    assert_eq!(
        row[..3],
        [
            MODEL.to_string(),
            digest[..12].to_string(),
            "98 MB".to_string()
        ]
    );
    assert!(row[3].ends_with(" ago"), "{listed}");

    // A chat through the server: the same greedy reply /api/chat gives.
    let said = ok(
        &server,
        &[
            "run",
            MODEL,
            "Name",
            "a",
            "colour.",
            "--temperature",
            "0",
            "--max-tokens",
            "12",
        ],
    );
    // Only the options the command line sets: the rest are the server's.
    let options = json!({"temperature": 0.0, "num_predict": 12});
    let reply = server.post_json(
        "/api/chat",
        json!({"model": MODEL, "stream": false, "options": options,
               "messages": [{"role": "user", "content": "Name a colour."}]}),
        200,
    );
    let content = reply["message"]["content"].as_str().unwrap();
    assert!(!content.is_empty());
    assert_eq!(said, format!("{content}\n"));

    // Loaded now: `ps` shows what /api/ps reports, tier bytes included.
    let api_ps: Value = server.get("/api/ps").json().unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&ok(&server, &["ps", "--json"])).unwrap(),
        api_ps
    );
    let m = &api_ps["models"][0];
    let table = ok(&server, &["ps"]);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 2, "{table}");
    assert_eq!(cells(lines[0]), cells(PS_HEADER));
    let bytes = |v: &Value| human_bytes(v.as_u64().unwrap());
    let row = cells(lines[1]);
    // The chat above decoded tokens: the model reports its decode rate.
    let rate = m["slots"]["decode_tokens_per_second"].as_f64().unwrap();
    assert!(rate > 0.0, "{m}");
    assert_eq!(
        row[..11],
        [
            MODEL.to_string(),
            digest[..12].to_string(),
            bytes(&m["size"]),
            processor(
                m["size"].as_u64().unwrap(),
                m["size_vram"].as_u64().unwrap()
            ),
            m["residency"].as_str().unwrap().to_string(),
            bytes(&m["tier_bytes"]["gpu"]),
            bytes(&m["tier_bytes"]["ram"]),
            bytes(&m["tier_bytes"]["stream"]),
            format!("0/{}", m["slots"]["parallel"]),
            format!("{rate:.1}"),
            m["context_length"].to_string(),
        ],
        "{table}"
    );
    let tier = |t: &str| m["tier_bytes"][t].as_u64().unwrap();
    assert_eq!(m["size"].as_u64().unwrap(), tier("gpu") + tier("ram"));
    assert_eq!(m["size_vram"].as_u64().unwrap(), tier("gpu"));
    assert_eq!(
        m["slots"],
        json!({"active": 0, "queued": 0, "parallel": 4, "decode_tokens_per_second": rate})
    );
    assert!(row[11].ends_with(" from now"), "{table}");

    let show: Value = server.post_json("/api/show", json!({"model": MODEL}), 200);
    let shown = ok(&server, &["show", MODEL]);
    let context = show["model_info"]["llama.context_length"].to_string();
    for line in [
        "  Model",
        "    architecture        llama",
        "    parameters          135M",
        &format!("    context length      {context}"),
        "    quantization        Q4_1",
        "  Capabilities",
        "    completion",
        "  Parameters",
        "    num_ctx    4096",
    ] {
        assert!(shown.lines().any(|l| l == line), "{line:?} in\n{shown}");
    }
    assert_eq!(
        ok(&server, &["show", MODEL, "--template"]),
        format!("{}\n", show["template"].as_str().unwrap())
    );
    assert_eq!(
        serde_json::from_str::<Value>(&ok(&server, &["show", MODEL, "--json"])).unwrap()["details"],
        show["details"]
    );

    assert_eq!(ok(&server, &["stop", MODEL]), "");
    wait_until(Duration::from_secs(30), "the model is unloaded", || {
        server.get("/api/ps").json::<Value>().unwrap()["models"] == json!([])
    });
    let out = hypura_at(Some(&server.base), None, &["stop", "nosuch"], "");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        "error: couldn't find model \"nosuch\" to stop\n"
    );
}

#[test]
fn run_name_without_prompt_is_a_repl_keeping_the_conversation() {
    let server = Server::start(&[]);
    let out = hypura_at(
        Some(&server.base),
        None,
        &[
            "run",
            MODEL,
            "--interactive",
            "--temperature",
            "0",
            "--max-tokens",
            "8",
            "--verbose",
        ],
        "Hello!\nWhat did I just say?\n/bye\n",
    );
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    // Two replies; the second turn's prompt holds the whole first exchange.
    let counts = |key: &str| -> Vec<u64> {
        err.lines()
            .filter_map(|l| l.strip_prefix(key)?.split_whitespace().next()?.parse().ok())
            .collect()
    };
    let (prompts, generated) = (counts("prompt eval count:"), counts("eval count:"));
    assert_eq!(prompts.len(), 2, "{err}");
    // The stats count the tokens evaluated: the second turn's prompt came
    // mostly from the prompt cache. The server's count of prompt tokens
    // looked up gives the whole of it.
    let series = format!("hypura_prefix_cache_queries_total{{model=\"{MODEL}\"}}");
    let looked_up = server.metric(&series).expect("the prefix cache's queries") as u64;
    let second = looked_up - prompts[0];
    assert!(second > prompts[0] + generated[0], "{second}: {err}");
    assert!(prompts[1] < second, "{err}");
    // With stdin not a terminal and no prompt, stdin is the prompt.
    let out = hypura_at(
        Some(&server.base),
        None,
        &["run", MODEL, "--max-tokens", "4", "--verbose"],
        "Hi",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(counts_in(&text(&out.stderr)), 1);
    // Without --verbose, nothing but the reply.
    let out = hypura_at(
        Some(&server.base),
        None,
        &["run", MODEL, "--max-tokens", "4"],
        "Hi",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stderr), "");
}

fn counts_in(err: &str) -> usize {
    err.lines()
        .filter(|l| l.starts_with("prompt eval count:"))
        .count()
}

#[test]
fn pull_shows_progress_and_serves_the_file() {
    let server = Server::start(&[]);
    let path = smollm2();
    let out = hypura_at(
        Some(&server.base),
        None,
        &["pull", path.to_str().unwrap(), "--name", "pulled:q4"],
        "",
    );
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(text(&out.stdout), "");
    assert!(
        err.lines()
            .any(|l| l.starts_with("verifying sha256 digest")),
        "{err}"
    );
    assert_eq!(err.lines().last(), Some("success"), "{err}");
    let listed = ok(&server, &["list"]);
    assert!(
        listed.lines().any(|l| cells(l)[0] == "pulled:q4"),
        "{listed}"
    );

    let out = ok(&server, &["pull", MODEL, "--json"]);
    let last: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(last, json!({"status": "success"}));

    let out = hypura_at(Some(&server.base), None, &["pull", "llama3"], "");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).starts_with("error: "),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn the_server_comes_from_hypura_host_then_ollama_host() {
    let server = Server::start(&[]);
    let port = server.base.rsplit(':').next().unwrap().to_string();
    // Ollama's forms: no scheme, host:port.
    let out = hypura_at(None, Some(&format!("127.0.0.1:{port}")), &["list"], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = hypura_at(None, Some(&format!(":{port}")), &["list"], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    // HYPURA_HOST wins.
    let out = hypura_at(Some(&server.base), Some("127.0.0.1:1"), &["list"], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = hypura_at(Some("127.0.0.1:1"), Some(&server.base), &["list"], "");
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.starts_with("error: could not reach the server at http://127.0.0.1:1: "),
        "{err}"
    );
    assert!(err.contains("is `hypura serve` running?"), "{err}");
}
