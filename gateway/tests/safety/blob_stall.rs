//! A blob upload whose body stalls is answered 408 when the body read
//! timeout (30 s) passes, as every other route's body is (issue 29, item 7).
#[path = "../common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::Server;

#[test]
fn a_stalled_blob_upload_is_a_408_at_the_body_timeout() {
    let dir = std::env::temp_dir().join(format!("hypura-blob-stall-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let s = Server::start(&["--models-dir", dir.to_str().unwrap()]);
    let address = s.base.trim_start_matches("http://").to_string();
    let mut stream = TcpStream::connect(&address).unwrap();
    let digest = format!("sha256:{}", "ab".repeat(32));
    let head = format!(
        "POST /api/blobs/{digest} HTTP/1.1\r\nHost: {address}\r\nContent-Length: 1000000\r\n\
         Content-Type: application/octet-stream\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).unwrap();
    // A GGUF header's start, then nothing more.
    stream.write_all(b"GGUF\x03\x00\x00\x00").unwrap();
    let started = Instant::now();
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let mut answer = [0u8; 512];
    let n = stream.read(&mut answer).expect("an answer before 120 s");
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(
        answer.starts_with("HTTP/1.1 408 "),
        "after {:?}: {answer}",
        started.elapsed()
    );
    eprintln!("stalled blob upload: 408 after {:?}", started.elapsed());
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}
