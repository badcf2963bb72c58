//! Request bodies and connections within bounds (issue 30, items 5, 6, 9
//! and 11): each test starts from the issue's reproducer against a real
//! `hypura serve` over SmolLM2.
#[path = "../common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{client, wait_until, Server, MODEL};
use serde_json::{json, Value};

/// `VmRSS` and `VmHWM` (peak) of process `pid`, in bytes.
fn memory(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap()
            * 1024
    };
    (field("VmRSS:"), field("VmHWM:"))
}

const MIB: u64 = 1 << 20;

/// An 8 MB body that is a 400 once read (its string never ends).
fn bad_body() -> Vec<u8> {
    let mut body = br#"{"model": "x", "prompt": ""#.to_vec();
    body.resize(8 << 20, b'a');
    body
}

/// Sends `bodies` at once to `/api/generate`; their statuses (0: no answer).
fn burst(s: &Server, bodies: usize, key: Option<&str>) -> Vec<u16> {
    let body = bad_body();
    let senders: Vec<_> = (0..bodies)
        .map(|_| {
            let (url, body, key) = (s.url("/api/generate"), body.clone(), key.map(String::from));
            std::thread::spawn(move || {
                let mut request = client()
                    .post(url)
                    .header("content-type", "application/json")
                    .body(body);
                if let Some(key) = key {
                    request = request.bearer_auth(key);
                }
                request.send().map_or(0, |r| r.status().as_u16())
            })
        })
        .collect();
    senders.into_iter().map(|t| t.join().unwrap()).collect()
}

fn version_answers(s: &Server) {
    assert_eq!(s.get("/api/version").status(), 200);
}

/// 250 concurrent 30 MB bodies left the server at 5.5 GB, 350 aborted it:
/// now the bodies in memory are bounded by `--body-memory`, each body past
/// it waits briefly, then is a 503 (never a reset connection), and the
/// server's peak memory stays within the budget.
#[test]
fn concurrent_big_bodies_stay_within_the_body_memory() {
    let s = Server::start(&["--body-memory", "32MiB"]);
    version_answers(&s);
    let (_, peak_before) = memory(s.pid());
    let statuses = burst(&s, 40, None);
    let (_, peak) = memory(s.pid());
    eprintln!(
        "40 x 8 MB bodies, --body-memory 32MiB: peak {} MiB -> {} MiB; statuses {statuses:?}",
        peak_before / MIB,
        peak / MIB
    );
    assert!(
        statuses.iter().all(|&c| c == 400 || c == 503),
        "{statuses:?}"
    );
    assert!(
        statuses.contains(&400),
        "some bodies were read: {statuses:?}"
    );
    // The budget, hyper's read buffers (~400 KB a connection) and the rest.
    assert!(
        peak < peak_before + 96 * MIB,
        "peak {} MiB (from {} MiB)",
        peak / MIB,
        peak_before / MIB
    );
    version_answers(&s);
    // A body that holds the whole budget while it arrives: the next one
    // waits, then is a 503 to retry.
    let address = s.base.trim_start_matches("http://");
    let mut holder = TcpStream::connect(address).unwrap();
    holder
        .write_all(
            b"POST /api/generate HTTP/1.1\r\nHost: localhost\r\n\
              Content-Type: application/json\r\nContent-Length: 33554432\r\n\r\n{",
        )
        .unwrap();
    let mut refused = None;
    wait_until(Duration::from_secs(30), "a body finds no room", || {
        let answer = s.post("/api/show", json!({"model": MODEL}));
        let no_room = answer.status() == 503;
        refused = Some(answer);
        no_room
    });
    let refused = refused.unwrap();
    assert_eq!(refused.headers()["retry-after"], "1");
    assert_eq!(
        refused.json::<Value>().unwrap()["error"],
        "the server is reading too many request bodies at once (their 33554432 bytes of \
         memory, [server] body_memory, are taken): retry shortly"
    );
    drop(holder);
    wait_until(Duration::from_secs(30), "the room is back", || {
        s.post("/api/show", json!({"model": MODEL})).status() == 200
    });

    // A body declared larger than the limit is a 413, read and dropped (a
    // client sending it whole sees the answer, not a reset connection)...
    let answer = client()
        .post(s.url("/api/generate"))
        .header("content-type", "application/json")
        .body(vec![b' '; 40 << 20])
        .send()
        .unwrap();
    assert_eq!(answer.status(), 413);
    // ... or unread when the client waits for `100 Continue`.
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n\
              Content-Type: application/json\r\nContent-Length: 41943040\r\n\
              Expect: 100-continue\r\n\r\n",
        )
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 413 "), "{answer}");
    assert!(
        answer.ends_with(
            r#""message":"request body too large: the limit is 33554432 bytes ([server] max_body_bytes)","type":"invalid_request_error","param":null,"code":null}}"#
        ),
        "{answer}"
    );
    drop(s);

    // With an API key, bodies without it are refused before they are read.
    let s = Server::start(&["--body-memory", "32MiB", "--api-key", "k"]);
    let (_, peak_before) = memory(s.pid());
    let statuses = burst(&s, 40, None);
    let (_, peak) = memory(s.pid());
    assert!(statuses.iter().all(|&c| c == 401 || c == 0), "{statuses:?}");
    assert!(peak < peak_before + 32 * MIB, "peak {} MiB", peak / MIB);
    let statuses = burst(&s, 4, Some("k"));
    assert_eq!(statuses, [400; 4]);
}

/// A raw request: its head, then its body one byte at a time (pausing
/// `every` between bytes) until the server answers; the answer, read to the
/// end of the connection.
fn trickle(s: &Server, every: Duration) -> (String, usize) {
    let address = s.base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .write_all(
            b"POST /api/generate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
              Content-Length: 1000\r\n\r\n",
        )
        .unwrap();
    stream.set_read_timeout(Some(every)).unwrap();
    let mut sent = 0;
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => {
                answer.extend_from_slice(&buffer[..n]);
                // The rest of the answer, up to the connection's end.
                stream
                    .set_read_timeout(Some(Duration::from_secs(30)))
                    .unwrap();
                stream
                    .read_to_end(&mut answer)
                    .expect("the connection closes");
                break;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(sent < 1000, "the whole body went without an answer");
                if stream.write_all(b" ").is_ok() {
                    sent += 1;
                }
            }
            Err(e) => panic!("{e}"),
        }
    }
    (String::from_utf8_lossy(&answer).into_owned(), sent)
}

/// Bodies of one byte every 10-25 s stayed open forever (the timeout
/// restarted with every byte): now a body must arrive whole within
/// `--body-timeout` of its head, else a 408 and the connection closed.
#[test]
fn a_trickled_body_times_out_as_a_whole() {
    let s = Server::start(&["--body-timeout", "2s"]);
    let (answer, sent) = trickle(&s, Duration::from_millis(200));
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
    assert!(
        answer.contains(r#"{"error":"the request body did not arrive within 2 s"}"#),
        "{answer}"
    );
    assert!(answer.contains("connection: close"), "{answer}");
    // Bytes kept coming, each well within the timeout: a timer restarted
    // with each would never have fired.
    assert!(sent >= 3, "{sent} bytes sent");
    version_answers(&s);
}

/// Opens `n` connections that send nothing.
fn idle_connections(s: &Server, n: usize) -> Vec<TcpStream> {
    let address = s.base.trim_start_matches("http://");
    (0..n)
        .map(|_| TcpStream::connect(address).unwrap())
        .collect()
}

/// The answer of a request on a new connection, read to its end.
fn raw_get(s: &Server, path: &str) -> String {
    let address = s.base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    let _ = stream.write_all(request.as_bytes());
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

/// There was no cap on connections: now one address may hold
/// `--max-connections-per-ip`, all together `--max-connections`; one more
/// is answered 503 and closed, and a place freed is taken again.
#[test]
fn connections_are_capped_per_address_and_in_all() {
    let s = Server::start(&["--max-connections-per-ip", "4"]);
    let mut held = idle_connections(&s, 4);
    let refused = raw_get(&s, "/api/version");
    assert!(refused.starts_with("HTTP/1.1 503 "), "{refused}");
    assert!(
        refused.contains(
            "this address has 4 connections open, the limit per client ([server] \
             max_connections_per_ip): close some or retry shortly"
        ),
        "{refused}"
    );
    held.pop();
    wait_until(Duration::from_secs(10), "a closed place is free", || {
        raw_get(&s, "/api/version").starts_with("HTTP/1.1 200 ")
    });
    drop(held);
    drop(s);

    let s = Server::start(&["--max-connections", "3"]);
    let _held = idle_connections(&s, 3);
    let refused = raw_get(&s, "/api/version");
    assert!(refused.starts_with("HTTP/1.1 503 "), "{refused}");
    assert!(
        refused.contains("the server has 3 connections open, its limit"),
        "{refused}"
    );
}

/// After the bad-input suite the server stayed at 2.5 GB: now the memory
/// of a burst of big bodies goes back to the system once they are freed.
#[test]
fn memory_goes_back_after_a_burst() {
    let s = Server::start(&[]);
    // Warm: the routes used below have answered once.
    version_answers(&s);
    assert_eq!(burst(&s, 1, None), [400]);
    let (start, _) = memory(s.pid());
    let statuses = burst(&s, 40, None);
    assert!(statuses.iter().all(|&c| c == 400), "{statuses:?}");
    let (after, peak) = memory(s.pid());
    eprintln!(
        "burst of 40 x 8 MB: RSS {} MiB at start, peak {} MiB, {} MiB after",
        start / MIB,
        peak / MIB,
        after / MIB
    );
    assert!(peak > start + 64 * MIB, "the burst was in memory at once");
    let mut now = after;
    wait_until(
        Duration::from_secs(30),
        "RSS is back under 1.5x start",
        || {
            now = memory(s.pid()).0;
            now * 2 < start * 3
        },
    );
    eprintln!("RSS back to {} MiB", now / MIB);
    version_answers(&s);
}

/// The error's message, in any family's shape.
fn message(body: &Value) -> &str {
    body["error"]
        .as_str()
        .or(body["error"]["message"].as_str())
        .unwrap()
}

/// A 10 MB `format` string came back whole inside the 400: now an error
/// echoes at most a few hundred characters of any input, with what was
/// cut counted.
#[test]
fn error_bodies_echo_a_bounded_part_of_the_input() {
    let s = Server::start(&[]);
    let big = "x".repeat(10 << 20);
    let cases = [
        (
            "/api/generate",
            json!({"model": MODEL, "prompt": "Hi", "format": big}),
            "invalid format \"xxx",
            "xxx\": use \"json\" or a JSON Schema object",
        ),
        (
            "/api/generate",
            json!({"model": MODEL, "prompt": "Hi", "options": {"temperature": big}}),
            "invalid JSON body: options.temperature: invalid type: string \"xxx",
            "xxx\", expected f32 at line 1 column 10485846",
        ),
        (
            "/v1/chat/completions",
            json!({"model": big, "messages": [{"role": "user", "content": "Hi"}]}),
            "",
            "",
        ),
        (
            "/v1/messages",
            json!({"model": MODEL, "max_tokens": 4, "temperature": big,
                "messages": [{"role": "user", "content": "Hi"}]}),
            "",
            "",
        ),
    ];
    for (path, body, starts, ends) in cases {
        let answer = s.post(path, body);
        assert_eq!(answer.status(), 400, "{path}");
        let text = answer.text().unwrap();
        assert!(text.len() < 1024, "{path}: {} bytes", text.len());
        let body: Value = serde_json::from_str(&text).unwrap();
        let message = message(&body);
        assert!(message.starts_with(starts), "{path}: {message}");
        assert!(message.ends_with(ends), "{path}: {message}");
        assert!(message.contains(" bytes left out] "), "{path}: {message}");
    }
}
