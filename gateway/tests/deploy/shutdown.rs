//! SIGTERM: `hypura serve` stops taking connections, lets in-flight streams
//! finish within `--shutdown-grace`, cancels those still running (each ends
//! with one error line, a clean end of its NDJSON), and exits within the bound.
#[path = "../common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{Server, MODEL};
use serde_json::{json, Value};

/// Starts a streaming generate of up to `num_predict` tokens on its own
/// thread; returns a receiver of its NDJSON lines (parsed; the channel closes
/// at the end of the body) after the first line has arrived.
fn stream(server: &Server, num_predict: u32) -> (mpsc::Receiver<Value>, Value) {
    let url = server.url("/api/generate");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let body = json!({
            "model": MODEL,
            "raw": true,
            "prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
            "options": {"temperature": 0, "num_predict": num_predict},
        });
        let response = common::client().post(url).json(&body).send().expect("POST");
        assert_eq!(response.status(), 200);
        for line in BufReader::new(response).lines() {
            let line = line.expect("the body ends cleanly, never cut");
            let value: Value = serde_json::from_str(&line).expect("one JSON object per line");
            if tx.send(value).is_err() {
                return;
            }
        }
    });
    let first = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("a first chunk");
    (rx, first)
}

fn sigterm(server: &Server) {
    let status = Command::new("kill")
        .args(["-TERM", &server.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// The lines after the first, up to the end of the body.
fn rest(rx: &mpsc::Receiver<Value>) -> Vec<Value> {
    let mut lines = Vec::new();
    while let Ok(v) = rx.recv_timeout(Duration::from_secs(60)) {
        lines.push(v);
    }
    lines
}

#[test]
fn a_stream_past_the_grace_period_is_cancelled_with_an_error_line() {
    let mut server = Server::start(&["--shutdown-grace", "1"]);
    // About 4,000 tokens of counting: far longer than the grace period.
    let (rx, first) = stream(&server, 4000);
    assert_eq!(first["done"], false);
    let signalled = Instant::now();
    sigterm(&server);
    // Grace (1 s) + the hard stop (5 s) at most, with room for a slow machine.
    let status = server.wait(Duration::from_secs(15));
    let took = signalled.elapsed();
    assert!(status.success(), "{status:?}\n{}", server.log());
    let lines = rest(&rx);
    let last = lines.last().expect("lines after the first");
    assert!(
        last["error"]
            .as_str()
            .is_some_and(|e| e.contains("shutting down")),
        "{last}"
    );
    assert!(lines[..lines.len() - 1].iter().all(|l| l["done"] == false));
    assert!(took >= Duration::from_secs(1), "{took:?}");
    let log = server.log();
    assert!(
        log.contains("grace period over, cancelling in-flight requests"),
        "{log}"
    );
    assert!(!log.contains("shutdown took too long"), "{log}");
}

#[test]
fn a_stream_within_the_grace_period_finishes() {
    let mut server = Server::start(&[]);
    let (rx, first) = stream(&server, 24);
    assert_eq!(first["done"], false);
    sigterm(&server);
    // A new connection is refused at once; the stream goes on.
    common::wait_until(
        Duration::from_secs(10),
        "new connections are refused",
        || common::client().get(server.url("/")).send().is_err(),
    );
    let status = server.wait(Duration::from_secs(25));
    assert!(status.success(), "{status:?}\n{}", server.log());
    let lines = rest(&rx);
    let last = lines.last().expect("lines after the first");
    assert_eq!(last["done"], true, "{last}");
    assert_eq!(last["eval_count"], 24, "{last}");
    assert!(!server.log().contains("cancelling"), "{}", server.log());
}
