//! `POST /api/pull` end to end: a real `hypura serve` pulling SmolLM2 from a
//! loopback HTTP server started here, and from local paths.
#[path = "../common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};

use common::{ndjson, Server, MODEL};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const SMOL_BYTES: u64 = 98_362_432;
const SMOL_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
const NOT_A_MODEL: &[u8] = b"<html><body>Not a model</body></html>\n";
const TRUNCATED_BYTES: usize = 1 << 20;

/// Starts a loopback HTTP/1.1 server; its base URL. `GET /files/smol-pulled.gguf`
/// answers SmolLM2, `/files/not-a-model.gguf` an HTML page,
/// `/files/truncated.gguf` SmolLM2's first MiB; anything else is a 404.
fn file_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || answer(stream));
        }
    });
    base
}

fn answer(mut stream: TcpStream) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header == "\r\n" {
            break;
        }
    }
    let path = request_line.split_whitespace().nth(1).unwrap_or("/");
    let head = |status: &str, length: u64| {
        format!(
            "HTTP/1.1 {status}\r\nContent-Length: {length}\r\n\
             Content-Type: application/octet-stream\r\nConnection: close\r\n\r\n"
        )
    };
    match path {
        "/files/smol-pulled.gguf" => {
            let mut file = std::fs::File::open(common::smollm2())?;
            stream.write_all(head("200 OK", SMOL_BYTES).as_bytes())?;
            std::io::copy(&mut file, &mut stream)?;
        }
        "/files/truncated.gguf" => {
            let mut start = vec![0u8; TRUNCATED_BYTES];
            std::fs::File::open(common::smollm2())?.read_exact(&mut start)?;
            stream.write_all(head("200 OK", start.len() as u64).as_bytes())?;
            stream.write_all(&start)?;
        }
        "/files/not-a-model.gguf" => {
            stream.write_all(head("200 OK", NOT_A_MODEL.len() as u64).as_bytes())?;
            stream.write_all(NOT_A_MODEL)?;
        }
        _ => {
            stream.write_all(head("404 Not Found", 9).as_bytes())?;
            stream.write_all(b"not found")?;
        }
    }
    stream.flush()
}

/// An empty directory of its own for one test.
fn empty_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hypura-pull-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The names in `dir`, hidden ones included, sorted; none when it does not exist.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn sha256_file(path: &Path) -> String {
    let mut hasher = Sha256::new();
    std::io::copy(&mut std::fs::File::open(path).unwrap(), &mut hasher).unwrap();
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn tag<'a>(tags: &'a Value, name: &str) -> &'a Value {
    tags["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == name)
        .unwrap_or_else(|| panic!("{name} is not in {tags}"))
}

/// A server that may pull from the loopback file server: `127.0.0.1` is an
/// allowed host and private addresses are allowed (by default neither is).
fn start_pulling(dir: &Path) -> Server {
    let config = dir.with_extension("toml");
    std::fs::write(
        &config,
        "[server]\npull_hosts = [\"127.0.0.1\"]\npull_allow_private = true\n",
    )
    .unwrap();
    Server::start(&[
        "--models-dir",
        dir.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
    ])
}

fn pull_lines(s: &Server, body: Value) -> Vec<Value> {
    let r = s.post("/api/pull", body);
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/x-ndjson");
    ndjson(&r.text().unwrap())
}

fn greedy_answer(s: &Server, model: &str) -> Value {
    let body = json!({"model": model, "prompt": "What is the capital of Germany?",
        "stream": false, "options": {"temperature": 0, "num_predict": 8}});
    s.post_json("/api/generate", body, 200)["response"].clone()
}

#[test]
fn pulls_a_url_into_the_models_dir_and_serves_it() {
    let files = file_server();
    let dir = empty_dir("url");
    let s = start_pulling(&dir);
    let url = format!("{files}/files/smol-pulled.gguf");
    let digest = format!("sha256:{SMOL_SHA256}");

    let lines = pull_lines(&s, json!({"model": url}));
    let n = lines.len();
    assert_eq!(lines[0], json!({"status": "pulling manifest"}));
    assert_eq!(
        lines[1],
        json!({"status": "downloading smol-pulled.gguf", "total": SMOL_BYTES, "completed": 0})
    );
    let mut previous = 0;
    for line in &lines[2..n - 3] {
        assert_eq!(line["status"], "downloading smol-pulled.gguf");
        assert_eq!(line["total"], SMOL_BYTES);
        assert!(line.get("digest").is_none(), "{line}");
        let completed = line["completed"].as_u64().unwrap();
        assert!(completed >= previous && completed <= SMOL_BYTES, "{line}");
        previous = completed;
    }
    assert_eq!(
        lines[n - 3],
        json!({"status": "downloading smol-pulled.gguf", "digest": digest,
               "total": SMOL_BYTES, "completed": SMOL_BYTES})
    );
    assert_eq!(
        lines[n - 2],
        json!({"status": "verifying sha256 digest", "digest": digest})
    );
    assert_eq!(lines[n - 1], json!({"status": "success"}));

    // One file in the models directory, under the URL's name, hashing to the digest reported.
    assert_eq!(listing(&dir), ["smol-pulled.gguf"]);
    assert_eq!(
        format!("sha256:{}", sha256_file(&dir.join("smol-pulled.gguf"))),
        digest
    );

    let tags: Value = s.get("/api/tags").json().unwrap();
    let pulled = tag(&tags, "smol-pulled:latest");
    assert_eq!(pulled["size"], SMOL_BYTES);
    assert_eq!(pulled["digest"], SMOL_SHA256);
    assert_eq!(pulled["details"]["quantization_level"], "Q4_1");

    // The same bytes answer as the model served from the start.
    let answer = greedy_answer(&s, "smol-pulled");
    assert!(!answer.as_str().unwrap().is_empty());
    assert_eq!(answer, greedy_answer(&s, MODEL));

    // Again under a name given Ollama-style, as one object.
    let r = s.post(
        "/api/pull",
        json!({"model": url, "name": "smol:pulled", "stream": false}),
    );
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().unwrap(), json!({"status": "success"}));
    let tags: Value = s.get("/api/tags").json().unwrap();
    assert_eq!(tag(&tags, "smol:pulled")["digest"], SMOL_SHA256);
    assert_eq!(listing(&dir), ["smol-pulled.gguf"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn failed_pulls_leave_nothing_behind() {
    let files = file_server();
    let dir = empty_dir("fail");
    let s = start_pulling(&dir);

    // 404: the error is a line of the stream, or the status when not streamed.
    let missing = format!("{files}/files/missing.gguf");
    let message =
        format!("downloading {missing}: the server answered 404 Not Found; check the URL");
    assert_eq!(
        pull_lines(&s, json!({"model": missing})),
        [
            json!({"status": "pulling manifest"}),
            json!({"error": message})
        ]
    );
    let r = s.post("/api/pull", json!({"model": missing, "stream": false}));
    assert_eq!(r.status(), 400);
    assert_eq!(r.json::<Value>().unwrap(), json!({"error": message}));

    // Not a GGUF: refused from its first bytes, which are not echoed; removed.
    let html = format!("{files}/files/not-a-model.gguf");
    assert_eq!(
        pull_lines(&s, json!({"model": html})),
        [
            json!({"status": "pulling manifest"}),
            json!({"status": "downloading not-a-model.gguf",
                   "total": NOT_A_MODEL.len(), "completed": 0}),
            json!({"error": format!("{html} is not a GGUF file (it does not begin with a GGUF \
                header); hypura loads GGUF model files only")}),
        ]
    );

    let truncated = format!("{files}/files/truncated.gguf");
    let lines = pull_lines(&s, json!({"model": truncated}));
    assert_eq!(
        lines.last().unwrap(),
        &json!({"error": format!("{truncated} is truncated: the array 'tokenizer.ggml.merges' \
            needs 391200 bytes at offset 960195 but the file has 1048576 bytes; re-download it")})
    );
    assert_eq!(listing(&dir), Vec::<String>::new());

    // Refused before anything streams.
    let cases = [
        (
            json!({"model": "ftp://example.com/x.gguf"}),
            "cannot pull 'ftp://example.com/x.gguf': the scheme 'ftp' is not supported; use an \
             http:// or https:// URL, or a local path",
        ),
        (
            json!({"model": format!("{files}/files/model.bin")}),
            &*format!(
                "cannot pull '{files}/files/model.bin': the URL must name a .gguf file \
                 (…/model.gguf)"
            )
            .leak(),
        ),
        (
            json!({"model": "llama3"}),
            "pulling 'llama3' from a registry is not supported: pull a local path or an http(s) \
             URL of a .gguf file, or pass GGUF files to `hypura serve`",
        ),
        (
            json!({"model": format!("{files}/files/smol-pulled.gguf"), "name": "bad name"}),
            "invalid name \"bad name\": a model name is [namespace/]model[:tag] of letters, \
             digits and . _ - + characters",
        ),
        (json!({}), "model is required"),
    ];
    for (body, error) in cases {
        let r = s.post("/api/pull", body.clone());
        assert_eq!(r.status(), 400, "{body}");
        assert_eq!(
            r.json::<Value>().unwrap(),
            json!({"error": error}),
            "{body}"
        );
    }
    let served = std::fs::canonicalize(common::smollm2()).unwrap();
    let r = s.post(
        "/api/pull",
        json!({"model": format!("{files}/files/smol-pulled.gguf"), "name": MODEL}),
    );
    assert_eq!(r.status(), 400);
    assert_eq!(
        r.json::<Value>().unwrap(),
        json!({"error": format!("the name {MODEL} is taken by {}: give another `name`",
            served.display())})
    );
    assert_eq!(listing(&dir), Vec::<String>::new());

    // A name already served: nothing to fetch.
    assert_eq!(
        pull_lines(&s, json!({"name": MODEL})),
        [
            json!({"status": "pulling manifest"}),
            json!({"status": "success"})
        ]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn pulls_a_local_path_in_place() {
    let dir = empty_dir("local");
    let s = Server::start(&["--models-dir", dir.to_str().unwrap()]);
    let smol = common::smollm2();
    let modified = std::fs::metadata(&smol).unwrap().modified().unwrap();
    let digest = format!("sha256:{SMOL_SHA256}");

    let lines = pull_lines(
        &s,
        json!({"model": smol.to_str().unwrap(), "name": "smol:local"}),
    );
    let n = lines.len();
    assert_eq!(lines[0], json!({"status": "pulling manifest"}));
    assert_eq!(
        lines[1],
        json!({"status": "verifying sha256 digest", "total": SMOL_BYTES, "completed": 0})
    );
    for line in &lines[2..n - 2] {
        assert_eq!(line["status"], "verifying sha256 digest");
        assert_eq!(line["total"], SMOL_BYTES);
    }
    assert_eq!(
        lines[n - 2],
        json!({"status": "verifying sha256 digest", "digest": digest,
               "total": SMOL_BYTES, "completed": SMOL_BYTES})
    );
    assert_eq!(lines[n - 1], json!({"status": "success"}));

    let tags: Value = s.get("/api/tags").json().unwrap();
    let local = tag(&tags, "smol:local");
    assert_eq!(local["size"], SMOL_BYTES);
    assert_eq!(local["digest"], SMOL_SHA256);
    let answer = greedy_answer(&s, "smol:local");
    assert_eq!(answer, greedy_answer(&s, MODEL));
    // Served in place: nothing copied, the file untouched.
    assert_eq!(listing(&dir), Vec::<String>::new());
    assert_eq!(
        std::fs::metadata(&smol).unwrap().modified().unwrap(),
        modified
    );

    // Without a name: the stem, here the name it is served under already.
    let r = s.post(
        "/api/pull",
        json!({"model": smol.to_str().unwrap(), "stream": false}),
    );
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().unwrap(), json!({"status": "success"}));

    let fake = dir.join("fake.gguf");
    std::fs::write(&fake, b"hello").unwrap();
    let fake = std::fs::canonicalize(&fake).unwrap();
    let r = s.post("/api/pull", json!({"model": fake.to_str().unwrap()}));
    assert_eq!(r.status(), 400);
    assert_eq!(
        r.json::<Value>().unwrap(),
        json!({"error": format!("{} is not a GGUF file (it does not begin with a GGUF header); \
            hypura loads GGUF model files only", fake.display())})
    );
    let r = s.post("/api/pull", json!({"model": "/nonexistent/x.gguf"}));
    assert_eq!(r.status(), 400);
    assert_eq!(
        r.json::<Value>().unwrap(),
        json!({"error": "cannot pull '/nonexistent/x.gguf': not found or not allowed; give the \
            path of a GGUF file under the server's model roots ([server] model_roots)"})
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
