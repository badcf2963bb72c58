//! A real `hypura serve` on a free loopback port, for route tests.
#![allow(dead_code)]
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub mod charges;
pub mod templates;

pub const MODEL: &str = "SmolLM2-135M-Instruct.Q4_1:latest";

pub use hypura_gguf::testing::smollm2;

/// The saved profile of the GPU machine (`config/profiles/h200.json`).
pub fn h200_profile() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/profiles/h200.json")
}

/// A cache directory holding a measured hardware profile, so that servers
/// under test plan with it and never measure this machine in the
/// background (their placements do not depend on it: no GPU unless given
/// a budget, and under a budget every residency's placement is fixed).
pub fn profile_cache_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("hypura-test-cache-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(h200_profile(), dir.join("profile.json")).unwrap();
        dir
    })
    .clone()
}

/// A running server; killed when dropped.
pub struct Server {
    child: Option<Child>,
    pub base: String,
    log: Arc<Mutex<String>>,
}

impl Server {
    /// `hypura serve <smollm2> --port 0 <extra>`.
    pub fn start(extra: &[&str]) -> Server {
        let model = smollm2();
        let mut args = vec![
            "serve".to_string(),
            model.to_string_lossy().into_owned(),
            "--port".into(),
            "0".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        Self::start_with(&args)
    }

    pub fn start_with(args: &[String]) -> Server {
        Self::start_logging(args, "warn,llama.cpp=error")
    }

    /// [`Server::start_with`] logging at `rust_log` (its `RUST_LOG`).
    pub fn start_logging(args: &[String], rust_log: &str) -> Server {
        Self::start_in(args, rust_log, &profile_cache_dir())
    }

    /// [`Server::start_logging`] with `cache_dir` as its `HYPURA_CACHE_DIR`
    /// (where it finds the hardware profile it plans with).
    pub fn start_in(args: &[String], rust_log: &str, cache_dir: &Path) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_hypura"))
            .args(args)
            .env("RUST_LOG", rust_log)
            .env("HYPURA_CACHE_DIR", cache_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn hypura serve");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(addr) = line.split("listening on ").nth(1) {
                    let _ = tx.send(addr.trim().to_string());
                }
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let base = match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(base) => base,
            Err(_) => {
                let _ = child.kill();
                panic!("hypura serve did not start:\n{}", log.lock().unwrap());
            }
        };
        let server = Server {
            child: Some(child),
            base,
            log,
        };
        wait_until(Duration::from_secs(30), "the server answers /", || {
            client()
                .get(server.url("/"))
                .send()
                .is_ok_and(|r| r.status() == 200)
        });
        server
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Waits for the process to exit; its status.
    pub fn wait(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut().unwrap();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "the server did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The value of the `/metrics` line starting with `series` (name and labels).
    pub fn metric(&self, series: &str) -> Option<f64> {
        let text = self.get("/metrics").text().unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(series))
            .and_then(|v| v.trim().parse().ok())
    }

    pub fn get(&self, path: &str) -> reqwest::blocking::Response {
        client().get(self.url(path)).send().expect("GET")
    }

    pub fn post(&self, path: &str, body: serde_json::Value) -> reqwest::blocking::Response {
        client()
            .post(self.url(path))
            .json(&body)
            .send()
            .expect("POST")
    }

    pub fn post_raw(&self, path: &str, body: &'static str) -> reqwest::blocking::Response {
        client()
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .expect("POST")
    }

    /// POSTs and parses a JSON reply, asserting its status.
    pub fn post_json(&self, path: &str, body: serde_json::Value, status: u16) -> serde_json::Value {
        let r = self.post(path, body);
        assert_eq!(r.status().as_u16(), status, "{path}");
        r.json().expect("a JSON body")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(300))
        .build()
        .unwrap()
}

/// The most memory process `pid` has held, in bytes (`VmHWM` of
/// /proc/PID/status).
pub fn peak_memory(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    kib * 1024
}

/// Polls `condition` until it holds, failing after `timeout`.
pub fn wait_until(timeout: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(5);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// The JSON objects of an NDJSON body, checking there are no blank lines.
pub fn ndjson(body: &str) -> Vec<serde_json::Value> {
    assert!(body.ends_with('\n'), "NDJSON ends with a newline: {body:?}");
    body.lines()
        .map(|l| {
            assert!(!l.is_empty(), "blank line in NDJSON");
            serde_json::from_str(l).expect("one JSON object per line")
        })
        .collect()
}

/// The `data:` payloads of an SSE body.
pub fn sse(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            e.strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not a data event: {e:?}"))
                .to_string()
        })
        .collect()
}
