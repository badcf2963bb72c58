//! The Grafana dashboards (`dashboards/*.json`) against a real Prometheus
//! scraping a live gateway: two models under one RAM budget (one streamed,
//! one switched to its full placement: loads, a demotion, a promotion and a
//! switch), a refused request; then every panel's PromQL through
//! Prometheus's HTTP API must return data, every metric a dashboard names
//! must be one `/metrics` exports, and `promtool check metrics` must be
//! clean on `/metrics`.
//!
//! Needs `prometheus` and `promtool` (`scripts/install-deps.sh --test`).
//! With `HYPURA_DASHBOARD_ANSWERS=<dir>` it also saves each panel's answer
//! over the run (a range query) there, for `scripts/render-dashboards.py`.
#[path = "../common/mod.rs"]
mod common;
#[path = "../prom/mod.rs"]
mod prom;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::charges::{footprint, full, serve_args, streaming};
use common::{client, wait_until, Server};
use hypura_synth as synth;
use prom::Scrape;
use serde_json::{json, Value};

/// What `$__rate_interval` becomes here (Prometheus scrapes every second).
const RATE_INTERVAL: &str = "30s";

fn dashboards_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../dashboards")
}

/// Every dashboard: file name and JSON.
fn dashboards() -> Vec<(String, Value)> {
    let mut out: Vec<(String, Value)> = std::fs::read_dir(dashboards_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            (name, serde_json::from_str(&text).expect("dashboard JSON"))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(out.len() >= 2, "the overview and tiers dashboards");
    out
}

/// Every panel's queries: (panel id, title, expression).
fn queries(dashboard: &Value) -> Vec<(u64, String, String)> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            out.push((
                panel["id"].as_u64().unwrap(),
                panel["title"].as_str().unwrap().to_string(),
                target["expr"].as_str().unwrap().to_string(),
            ));
        }
    }
    out
}

/// An expression as Grafana sends it with every model selected.
fn substitute(expr: &str) -> String {
    expr.replace("$__rate_interval", RATE_INTERVAL)
        .replace("$model", ".*")
}

/// The metric names an expression reads (`hypura_*`, `process_*`), each as
/// the family `/metrics` declares (a histogram's `_bucket`, `_sum`, `_count`
/// belong to it).
fn metric_names(expr: &str, families: &std::collections::BTreeMap<String, String>) -> Vec<String> {
    let mut names = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let starts = (expr[i..].starts_with("hypura_") || expr[i..].starts_with("process_"))
            && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_'));
        if !starts {
            i += 1;
            continue;
        }
        let end = expr[i..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(expr.len(), |n| i + n);
        let name = &expr[i..end];
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| {
                let base = name.strip_suffix(suffix)?;
                (families.get(base).map(String::as_str) == Some("histogram")).then_some(base)
            })
            .unwrap_or(name);
        names.push(family.to_string());
        i = end;
    }
    names
}

/// The metrics dashboards query that `/metrics` does not declare.
fn unknown_metrics(
    exprs: &[String],
    families: &std::collections::BTreeMap<String, String>,
) -> BTreeSet<String> {
    exprs
        .iter()
        .flat_map(|e| metric_names(e, families))
        .filter(|n| !families.contains_key(n))
        .collect()
}

/// A Prometheus on a free loopback port scraping `target` every second;
/// killed when dropped.
struct Prometheus {
    child: Child,
    base: String,
    dir: PathBuf,
}

impl Prometheus {
    fn start(target: &str) -> Prometheus {
        let found = Command::new("prometheus").arg("--version").output();
        assert!(
            found.is_ok_and(|o| o.status.success()),
            "prometheus is not installed: run scripts/install-deps.sh --test"
        );
        let dir = std::env::temp_dir().join(format!("hypura-prometheus-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: hypura\n    static_configs:\n      \
                 - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start prometheus");
        let prometheus = Prometheus {
            child,
            base: format!("http://127.0.0.1:{port}"),
            dir,
        };
        wait_until(Duration::from_secs(30), "Prometheus is ready", || {
            client()
                .get(format!("{}/-/ready", prometheus.base))
                .send()
                .is_ok_and(|r| r.status() == 200)
        });
        prometheus
    }

    fn api(&self, path: &str, params: &[(&str, String)]) -> Value {
        let reply: Value = client()
            .get(format!("{}{path}", self.base))
            .query(params)
            .send()
            .unwrap()
            .json()
            .unwrap();
        assert_eq!(reply["status"], "success", "{path} {params:?}: {reply}");
        reply["data"].clone()
    }

    fn query(&self, expr: &str) -> Vec<Value> {
        let data = self.api("/api/v1/query", &[("query", expr.to_string())]);
        data["result"].as_array().unwrap().clone()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn generate(server: &Server, model: &str, n: u32) -> Value {
    let body = json!({"model": model, "prompt": "The capital of France is", "raw": true,
                      "stream": false, "options": {"temperature": 0, "num_predict": n}});
    server.post_json("/api/generate", body, 200)
}

fn residency(server: &Server, name: &str) -> Option<String> {
    let ps: Value = server.get("/api/ps").json().unwrap();
    ps["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == name)
        .map(|m| m["residency"].as_str().unwrap().to_string())
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[test]
fn every_dashboard_panel_returns_data_from_a_real_prometheus() {
    let started = Instant::now();
    let hot_path = common::smollm2();
    let dir = std::env::temp_dir().join(format!("hypura-dashboards-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cold_path = synth::cached::link_into(
        &synth::cached::derived_moe(&hot_path, 16, 2, 0.01, 7).unwrap(),
        &dir,
        "smollm2-moe.gguf",
    )
    .unwrap();
    let (hot, cold) = (footprint(&hot_path), footprint(&cold_path));
    // As in tests/pool/budget.rs: room for the cold one partly cached and the hot
    // one streaming; once the cold one is demoted, room for the hot one in full.
    let budget = streaming(&cold_path, cold.stream_bytes / 2)
        + streaming(&hot_path, hot.minimum_cache_bytes)
        + (1 << 20);
    assert!(
        full(&hot_path)
            + streaming(&hot_path, hot.minimum_cache_bytes)
            + streaming(&cold_path, cold.minimum_cache_bytes)
            < budget
    );
    let server = Server::start_with(&serve_args(
        &[&hot_path, &cold_path],
        budget,
        &["--queue-limit", "0"],
    ));
    let (hot_name, cold_name) = (common::MODEL, "smollm2-moe:latest");
    let target = server.base.trim_start_matches("http://").to_string();
    let prometheus = Prometheus::start(&target);
    let workload_start = now();

    // Mixed traffic: the cold model first, then the hot one until the
    // policy has moved both (a demotion, a promotion, a switch).
    generate(&server, cold_name, 8);
    generate(&server, hot_name, 8);
    wait_until(
        Duration::from_secs(60),
        "the hot model fully resident",
        || {
            generate(&server, hot_name, 8);
            residency(&server, hot_name).as_deref() == Some("full")
                && residency(&server, cold_name).as_deref() == Some("streaming")
        },
    );
    // A refusal: the one slot busy, no queue.
    let long = json!({"model": cold_name, "prompt": "1, 2, 3,", "raw": true,
                      "options": {"temperature": 0, "num_predict": 2000}});
    let mut busy = client()
        .post(server.url("/api/generate"))
        .json(&long)
        .send()
        .unwrap();
    let mut buf = [0u8; 64];
    assert!(busy.read(&mut buf).unwrap() > 0);
    assert_eq!(
        server
            .post("/api/generate", json!({"model": cold_name, "prompt": "x"}))
            .status(),
        503
    );
    drop(busy);
    // Its slot frees once the engine sees the client gone.
    wait_until(Duration::from_secs(30), "the slot is free again", || {
        let body = json!({"model": cold_name, "prompt": "Hi", "raw": true, "stream": false,
                          "options": {"temperature": 0, "num_predict": 2}});
        server.post("/api/generate", body).status() == 200
    });
    // Recent traffic on both, inside the rate window, through both API families.
    let phase_end = Instant::now() + Duration::from_secs(12);
    while Instant::now() < phase_end {
        generate(&server, cold_name, 12);
        let chat = json!({"model": hot_name, "messages": [{"role": "user", "content": "Hi"}],
                          "max_tokens": 12, "temperature": 0});
        server.post_json("/v1/chat/completions", chat, 200);
    }
    // Prometheus has scraped the last counts (at least: a count only grows).
    let text = server.get("/metrics").text().unwrap();
    let scrape = Scrape::parse(&text);
    let successes = scrape.sum("hypura_request_success_total", &[]);
    let value = |expr: &str| {
        prometheus
            .query(expr)
            .first()
            .and_then(|r| r["value"][1].as_str()?.parse::<f64>().ok())
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let seen = value("sum(hypura_request_success_total)");
        if seen.is_some_and(|seen| seen >= successes) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus saw {seen:?} successes, not {successes}; up {:?}, last scrape took {:?} s",
            value("up"),
            value("scrape_duration_seconds"),
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // promtool: the exposition is clean.
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (scripts/install-deps.sh --test)");
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let checked = promtool.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
    // The Gateway API Inference Extension reads vLLM's own names
    // (`vllm:num_requests_waiting`, ...): their `:` is the one lint allowed
    // (promtool then exits 1 with only those lines).
    let vllm_alias = |l: &str| l.starts_with("vllm:") && l.ends_with("should not contain ':'");
    let said: Vec<&str> = said
        .lines()
        .filter(|l| !l.trim().is_empty() && !vllm_alias(l))
        .collect();
    assert!(said.is_empty(), "promtool: {}", said.join("\n"));

    // Every metric the dashboards name is exported, and the check would see one that is not.
    let families = scrape.families();
    let all: Vec<(String, u64, String, String)> = dashboards()
        .iter()
        .flat_map(|(name, d)| {
            queries(d)
                .into_iter()
                .map(|(id, title, expr)| (name.clone(), id, title, expr))
        })
        .collect();
    let exprs: Vec<String> = all.iter().map(|q| q.3.clone()).collect();
    let unknown = unknown_metrics(&exprs, &families);
    assert!(
        unknown.is_empty(),
        "dashboards query metrics /metrics lacks: {unknown:?}"
    );
    let bogus = unknown_metrics(&["rate(hypura_no_such_thing_total[1m])".into()], &families);
    assert_eq!(
        bogus.into_iter().collect::<Vec<_>>(),
        ["hypura_no_such_thing_total"]
    );
    // Each dashboard has a model variable its queries use.
    for (name, d) in dashboards() {
        let variables = d["templating"]["list"].as_array().unwrap();
        assert!(variables.iter().any(|v| v["name"] == "model"), "{name}");
    }

    // Every panel's every query returns data, a number in at least one series.
    let answers = std::env::var_os("HYPURA_DASHBOARD_ANSWERS").map(PathBuf::from);
    let end = now();
    let mut empty = Vec::new();
    for (dashboard, id, title, expr) in &all {
        let result = prometheus.query(&substitute(expr));
        let numbers = result
            .iter()
            .filter_map(|r| r["value"][1].as_str()?.parse::<f64>().ok())
            .filter(|v| v.is_finite())
            .count();
        if numbers == 0 {
            empty.push(format!("{dashboard} #{id} {title}: {expr} → {result:?}"));
        }
        if let Some(dir) = &answers {
            let range = prometheus.api(
                "/api/v1/query_range",
                &[
                    ("query", substitute(expr)),
                    ("start", format!("{workload_start:.3}")),
                    ("end", format!("{end:.3}")),
                    ("step", "1".into()),
                ],
            );
            std::fs::create_dir_all(dir).unwrap();
            let file = dir.join(format!("{dashboard}-{id:02}.json"));
            let mut saved: Value = std::fs::read_to_string(&file)
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
                .filter(|v: &Value| v["queries"].is_array() && v["run"] == workload_start)
                .unwrap_or_else(|| {
                    json!({"dashboard": dashboard, "panel": id, "title": title,
                                          "run": workload_start, "queries": []})
                });
            saved["queries"]
                .as_array_mut()
                .unwrap()
                .push(json!({"expr": expr, "result": range["result"]}));
            std::fs::write(&file, serde_json::to_string_pretty(&saved).unwrap()).unwrap();
        }
    }
    assert!(
        empty.is_empty(),
        "panels without data:\n{}",
        empty.join("\n")
    );
    // The errors logged are the refusals' 503s.
    let log = server.log();
    let errors = log.lines().filter(|l| l.contains("ERROR"));
    assert!(errors.clone().all(|l| l.contains("503")), "{log}");
    eprintln!(
        "dashboards test took {:.1} s",
        started.elapsed().as_secs_f64()
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// What Grafana's import does with the data source picked for an input:
/// every `${NAME}` of the input in every string becomes its uid.
fn import_with(value: &Value, input: &str, uid: &str) -> Value {
    match value {
        Value::String(s) => Value::String(s.replace(&format!("${{{input}}}"), uid)),
        Value::Array(items) => items.iter().map(|v| import_with(v, input, uid)).collect(),
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| (k.clone(), import_with(v, input, uid)))
            .collect(),
        other => other.clone(),
    }
}

/// Every `datasource` field of a dashboard, with where it is.
fn datasources(value: &Value, at: &str, out: &mut Vec<(String, Value)>) {
    match value {
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                datasources(v, &format!("{at}/{i}"), out);
            }
        }
        Value::Object(map) => {
            for (k, v) in map {
                if k == "datasource" {
                    out.push((format!("{at}/{k}"), v.clone()));
                }
                datasources(v, &format!("{at}/{k}"), out);
            }
        }
        _ => {}
    }
}

#[test]
fn the_data_source_chosen_at_import_is_the_one_every_query_reads() {
    for (name, dashboard) in dashboards() {
        assert_eq!(
            dashboard["__inputs"],
            json!([{"name": "DS_PROMETHEUS", "label": "Prometheus", "type": "datasource",
                    "pluginId": "prometheus", "pluginName": "Prometheus"}]),
            "{name}"
        );
        // Provisioned without an import, `${DS_PROMETHEUS}` is the dashboard's
        // data source variable of that name (Grafana's default Prometheus).
        let variables = dashboard["templating"]["list"].as_array().unwrap();
        let variable = variables
            .iter()
            .find(|v| v["type"] == "datasource")
            .unwrap_or_else(|| panic!("{name}: no data source variable"));
        assert_eq!(variable["name"], "DS_PROMETHEUS", "{name}");
        assert_eq!(variable["query"], "prometheus", "{name}");

        let imported = import_with(&dashboard, "DS_PROMETHEUS", "chosen-at-import");
        // Every panel and every query names it: one without a data source
        // would read Grafana's default instead.
        for panel in imported["panels"].as_array().unwrap() {
            let title = panel["title"].as_str().unwrap();
            let want = json!({"type": "prometheus", "uid": "chosen-at-import"});
            assert_eq!(panel["datasource"], want, "{name}: panel {title}");
            for target in panel["targets"].as_array().unwrap() {
                assert_eq!(target["datasource"], want, "{name}: {title}: {target}");
            }
        }
        let mut all = Vec::new();
        datasources(&imported, "", &mut all);
        // Every query, its panel, and the query variables.
        assert!(all.len() > queries(&dashboard).len(), "{name}");
        for (at, datasource) in all {
            assert_eq!(
                datasource,
                json!({"type": "prometheus", "uid": "chosen-at-import"}),
                "{name}: {at}"
            );
        }
        assert_eq!(
            import_with(variable, "DS_PROMETHEUS", "chosen-at-import")["current"]["value"],
            "chosen-at-import",
            "{name}: the variable starts at the data source chosen"
        );
    }
}

/// Issue 28, item 5: on a fresh server that has run one request (its model
/// loaded, nothing refused, aborted, moved or streamed yet), every query
/// of every panel of both dashboards answers a series: those of a loaded
/// model exist at 0 before their first event.
#[test]
fn no_panel_is_empty_on_a_fresh_server_with_a_model_loaded() {
    let server = Server::start(&["--ram-budget", "4GiB", "--parallel", "2"]);
    generate(&server, common::MODEL, 8);
    let address = server.base.trim_start_matches("http://").to_string();
    let prometheus = Prometheus::start(&address);
    wait_until(
        Duration::from_secs(60),
        "Prometheus has three scrapes",
        || !prometheus.query("count_over_time(up[1m]) >= 3").is_empty(),
    );
    let mut empty = Vec::new();
    for (dashboard, d) in dashboards() {
        for (id, title, expr) in queries(&d) {
            // A series, even NaN (a quantile of no observations yet):
            // Grafana's "No data" is an empty answer.
            let result = prometheus.query(&substitute(&expr));
            if result.is_empty() {
                empty.push(format!("{dashboard} #{id} {title}: {expr} → {result:?}"));
            }
        }
    }
    assert!(
        empty.is_empty(),
        "panels without data on a fresh server:\n{}",
        empty.join("\n")
    );
}
