//! A conversation of 100,000 short messages (issue 30, item 4): it used to
//! make its model unusable for minutes (rendered and tokenized in the
//! runner's read loop, once per step of a bisection, with the timed-out
//! counts left running). Now it is answered in bounded work (a truncated
//! reply, or a 400 naming the limit with `truncate: false`), and while it
//! is worked on a simple request to the same model (the base of the model
//! it was sent to, so the same runner) and `/api/ps` answer.
#[path = "../common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::mpsc;
use std::time::Duration;

use common::{Server, MODEL};
use serde_json::{json, Value};

const MESSAGES: usize = 100_000;
const FLOOD: &str = "flood:latest";

/// `n` messages of one character each (under the byte check's 256 a
/// token of the window), the last the user's.
fn conversation(n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| {
            let role = if (n - i) % 2 == 1 {
                "user"
            } else {
                "assistant"
            };
            json!({"role": role, "content": (i % 10).to_string()})
        })
        .collect()
}

/// Sends `body` to `path` on a connection of its own and returns once the
/// whole request is written; the reply (its status, and head and body as
/// sent) comes on the channel.
fn send(server: &Server, path: &str, body: &Value) -> mpsc::Receiver<(u16, String)> {
    let address = server.base.trim_start_matches("http://").to_string();
    let body = serde_json::to_vec(body).unwrap();
    let mut stream = TcpStream::connect(address.as_str()).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(&body).unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut reply = String::new();
        stream.read_to_string(&mut reply).unwrap();
        let status = reply
            .strip_prefix("HTTP/1.1 ")
            .and_then(|r| r.get(..3))
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let _ = tx.send((status, reply));
    });
    rx
}

/// The value of header `name` in a reply's head.
fn header<'a>(reply: &'a str, name: &str) -> Option<&'a str> {
    let (head, _) = reply.split_once("\r\n\r\n")?;
    head.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

fn body_of(reply: &str) -> &str {
    reply.split_once("\r\n\r\n").map_or("", |(_, body)| body)
}

fn simple_chat() -> Value {
    json!({"model": MODEL, "stream": false,
           "messages": [{"role": "user", "content": "Say hi."}],
           "options": {"temperature": 0, "num_predict": 1}})
}

#[test]
fn a_hundred_thousand_messages_leave_the_model_usable() {
    // Created models go to a folder of the test's own.
    let models = std::env::temp_dir().join(format!("hypura-flood-{}", std::process::id()));
    std::fs::create_dir_all(&models).unwrap();
    let server = Server::start(&[
        "--parallel",
        "2",
        "--context",
        "512",
        "--models-dir",
        models.to_str().unwrap(),
    ]);
    // The flood goes to a model created from the base: it shares the base's
    // runner, which must go on answering the base's requests.
    let create = json!({"model": FLOOD, "from": MODEL, "system": "Be brief.", "stream": false});
    server.post_json("/api/create", create, 200);
    // Loaded before the flood, so that the simple request never waits on a load.
    server.post_json("/api/chat", simple_chat(), 200);

    // Truncated: the oldest messages go, and the reply is long enough to
    // still be running when the simple requests are over.
    let big = send(
        &server,
        "/api/chat",
        &json!({"model": FLOOD, "stream": false, "messages": conversation(MESSAGES),
                "options": {"temperature": 0, "num_predict": 64}}),
    );
    // The whole flood is sent: the simple requests and `/api/ps` come while
    // the server works on it.
    let (done, order) = mpsc::channel();
    let simple = {
        let done = done.clone();
        let url = server.url("/api/chat");
        std::thread::spawn(move || {
            let reply = common::client().post(url).json(&simple_chat()).send();
            let status = reply.map(|r| r.status().as_u16());
            done.send("simple").unwrap();
            status
        })
    };
    let ps = {
        let url = server.url("/api/ps");
        std::thread::spawn(move || {
            let reply = common::client().get(url).send();
            let status = reply.map(|r| r.status().as_u16());
            done.send("ps").unwrap();
            status
        })
    };
    let (status, raw) = big
        .recv_timeout(Duration::from_secs(240))
        .expect("the 100,000-message chat is answered");
    let finished_before: Vec<&str> = order.try_iter().collect();
    assert_eq!(status, 200, "{}", &raw[..raw.len().min(400)]);
    let reply: Value = serde_json::from_str(body_of(&raw)).unwrap();
    assert_eq!(reply["done"], true, "{reply}");
    assert!(
        reply["message"]["content"]
            .as_str()
            .is_some_and(|c| !c.is_empty()),
        "{reply}"
    );
    // The prompt kept fits the window with room for the reply: a few
    // tokens a message, so all but a hundred or two were dropped.
    let kept = reply["prompt_eval_count"].as_u64().unwrap();
    assert!(kept <= 512 - 64, "{reply}");
    let dropped: usize = header(&raw, "x-hypura-truncated-messages")
        .expect("the dropped messages are counted")
        .parse()
        .unwrap();
    assert!(
        (MESSAGES - 200..MESSAGES - 10).contains(&dropped),
        "{dropped}"
    );
    assert_eq!(simple.join().unwrap().unwrap(), 200);
    assert_eq!(ps.join().unwrap().unwrap(), 200);
    let mut finished_before = finished_before;
    finished_before.sort_unstable();
    assert_eq!(
        finished_before,
        ["ps", "simple"],
        "the simple chat and /api/ps answer before the flood does"
    );

    // Without truncation it can never fit: a 400 naming why, before any
    // rendering.
    let refused = send(
        &server,
        "/api/chat",
        &json!({"model": FLOOD, "stream": false, "truncate": false,
                "messages": conversation(MESSAGES)}),
    );
    let (status, raw) = refused.recv_timeout(Duration::from_secs(240)).unwrap();
    assert_eq!(status, 400, "{raw}");
    let error: Value = serde_json::from_str(body_of(&raw)).unwrap();
    // The created model's system message counts too.
    assert_eq!(
        error["error"],
        format!(
            "the conversation has {} messages but the context window holds 512 \
             tokens, and each message takes at least one: send at most 512 messages, or \
             turn truncation on to drop the oldest",
            MESSAGES + 1
        )
    );
    // The model answers as before.
    server.post_json("/api/chat", simple_chat(), 200);
    std::fs::remove_dir_all(&models).ok();
}
