//! Safe by default on a shared machine: web pages of other origins and
//! foreign `Host` names are refused, a LAN address needs a key, admin routes
//! can need their own key, and `/api/pull` reveals nothing and touches only
//! what it may. A real `hypura serve` over SmolLM2.
#[path = "../common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{client, Server, MODEL};
use serde_json::{json, Value};

/// A raw HTTP/1.1 request with exactly these headers; the status code.
fn raw_status(base: &str, request: &str) -> u16 {
    let addr = base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).unwrap();
    line.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {line:?}"))
}

fn get_with_host(s: &Server, host: &str) -> u16 {
    raw_status(
        &s.base,
        &format!("GET /api/tags HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
    )
}

/// Writes `text` as a TOML file of its own; its path.
fn config_file(tag: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hypura-security-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{tag}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

fn start_with_config(config: &Path, extra: &[&str]) -> Server {
    let mut args = vec![
        "serve".to_string(),
        common::smollm2().to_string_lossy().into_owned(),
        "--port".into(),
        "0".into(),
        "--config".into(),
        config.to_string_lossy().into_owned(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    Server::start_with(&args)
}

/// An empty directory of its own for one test.
fn empty_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hypura-sec-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn foreign_origins_and_hosts_are_refused_by_default() {
    let s = Server::start(&[]);
    let port = s.base.rsplit(':').next().unwrap().to_string();

    // A page of another site: refused, whatever the route, and told nothing by CORS.
    for (method, path, body) in [
        ("POST", "/api/pull", json!({"model": "/etc/shadow"})),
        (
            "POST",
            "/api/generate",
            json!({"model": MODEL, "prompt": "x"}),
        ),
        ("GET", "/api/tags", Value::Null),
    ] {
        let request = client()
            .request(method.parse().unwrap(), s.url(path))
            .header("origin", "https://evil.example")
            .header("content-type", "text/plain");
        let r = if body.is_null() {
            request.send()
        } else {
            request.body(body.to_string()).send()
        }
        .unwrap();
        assert_eq!(r.status(), 403, "{method} {path}");
        assert!(r.headers().get("access-control-allow-origin").is_none());
    }
    let preflight = client()
        .request(reqwest::Method::OPTIONS, s.url("/api/chat"))
        .header("origin", "https://evil.example")
        .header("access-control-request-method", "POST")
        .send()
        .unwrap();
    assert!(preflight
        .headers()
        .get("access-control-allow-origin")
        .is_none());

    // Local pages and desktop apps pass, and may read the answer.
    for origin in [
        "http://localhost:3000",
        "http://127.0.0.1:8080",
        "app://obsidian.md",
    ] {
        let r = client()
            .get(s.url("/api/tags"))
            .header("origin", origin)
            .send()
            .unwrap();
        assert_eq!(r.status(), 200, "{origin}");
        assert_eq!(r.headers()["access-control-allow-origin"], origin);
    }

    // DNS rebinding: a foreign Host is refused; loopback names pass.
    assert_eq!(get_with_host(&s, &format!("evil.example:{port}")), 403);
    assert_eq!(get_with_host(&s, "localhost.evil.example"), 403);
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
        "app.localhost".to_string(),
    ] {
        assert_eq!(get_with_host(&s, &host), 200, "{host}");
    }
}

#[test]
fn configured_origins_and_hosts_are_allowed() {
    let config = config_file(
        "origins",
        "[server]\nallowed_origins = [\"https://*.example.com\"]\n\
         allowed_hosts = [\"box.lan\"]\n",
    );
    let s = start_with_config(&config, &[]);
    let r = client()
        .get(s.url("/api/tags"))
        .header("origin", "https://chat.example.com")
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://chat.example.com"
    );
    let r = client()
        .get(s.url("/api/tags"))
        .header("origin", "https://example.org")
        .send()
        .unwrap();
    assert_eq!(r.status(), 403);
    assert_eq!(get_with_host(&s, "box.lan:11434"), 200);
    assert_eq!(get_with_host(&s, "other.lan"), 403);
}

#[test]
fn a_lan_address_needs_a_key() {
    let output = Command::new(env!("CARGO_BIN_EXE_hypura"))
        .args([
            "serve",
            common::smollm2().to_str().unwrap(),
            "--host",
            "0.0.0.0",
            "--port",
            "0",
        ])
        .env_remove("HYPURA_API_KEY")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("not a loopback address") && stderr.contains("--insecure-no-auth"),
        "{stderr}"
    );

    // Said explicitly: it serves, and the Host check is off on a LAN address.
    let s = Server::start(&["--host", "0.0.0.0", "--insecure-no-auth"]);
    assert_eq!(get_with_host(&s, "hypura-box.lan"), 200);
}

#[test]
fn admin_routes_need_the_admin_key() {
    let s = Server::start(&["--api-key", "user-key", "--admin-key", "admin-key"]);
    let send = |key: Option<&str>, path: &str, body: Value| {
        let mut request = client().post(s.url(path)).json(&body);
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        request.send().unwrap().status().as_u16()
    };
    let copy = json!({"source": MODEL, "destination": "smol:copy"});
    assert_eq!(send(None, "/api/copy", copy.clone()), 401);
    assert_eq!(send(Some("user-key"), "/api/copy", copy.clone()), 403);
    assert_eq!(send(Some("wrong"), "/api/copy", copy.clone()), 401);
    assert_eq!(
        send(Some("user-key"), "/api/pull", json!({"model": MODEL})),
        403
    );
    assert_eq!(send(Some("admin-key"), "/api/copy", copy), 200);
    // The user key still opens the other routes; the admin key opens them too.
    let show = json!({"model": "smol:copy"});
    assert_eq!(send(Some("user-key"), "/api/show", show.clone()), 200);
    assert_eq!(send(Some("admin-key"), "/api/show", show.clone()), 200);
    assert_eq!(send(None, "/api/show", show), 401);
    assert_eq!(
        send(
            Some("user-key"),
            "/api/delete",
            json!({"model": "smol:copy"})
        ),
        403
    );
}

/// Loopback HTTP server: `/files/smol.gguf` is SmolLM2, `/redirect.gguf`
/// redirects to `redirect_to`, anything else a 404.
fn file_server(redirect_to: Option<String>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let redirect_to = redirect_to.clone();
            std::thread::spawn(move || answer(stream, redirect_to));
        }
    });
    base
}

fn answer(mut stream: TcpStream, redirect_to: Option<String>) -> std::io::Result<()> {
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
    match (path, redirect_to) {
        ("/files/smol.gguf", _) => {
            let length = std::fs::metadata(common::smollm2())?.len();
            write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n"
            )?;
            std::io::copy(&mut std::fs::File::open(common::smollm2())?, &mut stream)?;
        }
        ("/redirect.gguf", Some(to)) => write!(
            stream,
            "HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )?,
        _ => write!(
            stream,
            "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )?,
    }
    stream.flush()
}

/// `/etc/shadow`, a FIFO, `../`, a symlink out of the roots, private URLs in
/// any spelling, a redirect to another host: each a 400 that reveals
/// nothing, at once, with nothing written.
#[test]
fn pulls_of_what_is_not_allowed_reveal_nothing() {
    let files = file_server(None);
    let port = files.rsplit(':').next().unwrap().to_string();
    let dir = empty_dir("refused");
    let fifo = dir.join("fifo.gguf");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    std::os::unix::fs::symlink("/etc/passwd", dir.join("passwd.gguf")).unwrap();
    let s = Server::start(&["--models-dir", dir.to_str().unwrap()]);

    let local = [
        "/etc/shadow".to_string(),
        "/etc/passwd".to_string(),
        "/nonexistent/x.gguf".to_string(),
        fifo.to_string_lossy().into_owned(),
        format!("{}/../../../etc/shadow", dir.display()),
        dir.join("passwd.gguf").to_string_lossy().into_owned(),
        "../../../../etc/shadow".to_string(),
        "/proc/self/environ".to_string(),
    ];
    let started = Instant::now();
    for source in &local {
        let r = s.post("/api/pull", json!({"model": source, "stream": false}));
        assert_eq!(r.status(), 400, "{source}");
        assert_eq!(
            r.json::<Value>().unwrap(),
            json!({"error": format!("cannot pull '{source}': not found or not allowed; give the \
                path of a GGUF file under the server's model roots ([server] model_roots)")}),
            "{source}"
        );
    }
    // The FIFO held no thread: all of them answered at once.
    assert!(started.elapsed() < Duration::from_secs(10));

    let remote = [
        format!("http://127.0.0.1:{port}/files/smol.gguf"),
        format!("http://0x7f000001:{port}/files/smol.gguf"),
        format!("http://2130706433:{port}/files/smol.gguf"),
        format!("http://[::1]:{port}/files/smol.gguf"),
        format!("http://[::ffff:127.0.0.1]:{port}/files/smol.gguf"),
        format!("http://localhost:{port}/files/smol.gguf"),
        "http://169.254.169.254/latest/x.gguf".to_string(),
        "http://10.0.0.1/x.gguf".to_string(),
        "https://example.com/x.gguf".to_string(),
    ];
    for source in &remote {
        let r = s.post("/api/pull", json!({"model": source, "stream": false}));
        assert_eq!(r.status(), 400, "{source}");
        assert_eq!(
            r.json::<Value>().unwrap(),
            json!({"error": format!("cannot pull '{source}': not found or not allowed; pulls may \
                download only from the hosts of [server] pull_hosts")}),
            "{source}"
        );
    }
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        2,
        "only the FIFO and the symlink"
    );
    let tags: Value = s.get("/api/tags").json().unwrap();
    assert_eq!(tags["models"].as_array().unwrap().len(), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Allowed hosts that are private need `pull_allow_private`; a redirect to
/// another host is refused; the size cap holds; HTML stops after its first
/// bytes without being echoed.
#[test]
fn url_pulls_follow_the_policy() {
    let target = file_server(None);
    let target_port = target.rsplit(':').next().unwrap().to_string();
    let redirector = file_server(Some(format!(
        "http://localhost:{target_port}/files/smol.gguf"
    )));
    let dir = empty_dir("policy");
    let private_denied = config_file("private-denied", "[server]\npull_hosts = [\"127.0.0.1\"]\n");
    let s = start_with_config(&private_denied, &["--models-dir", dir.to_str().unwrap()]);
    let url = format!("{target}/files/smol.gguf");
    let r = s.post("/api/pull", json!({"model": url, "stream": false}));
    assert_eq!(r.status(), 400);
    assert!(r.text().unwrap().contains("not found or not allowed"));
    drop(s);

    let capped = config_file(
        "capped",
        "[server]\npull_hosts = [\"127.0.0.1\"]\npull_allow_private = true\n\
         pull_max_bytes = \"1MiB\"\n",
    );
    let s = start_with_config(&capped, &["--models-dir", dir.to_str().unwrap()]);
    let r = s.post("/api/pull", json!({"model": url, "stream": false}));
    assert_eq!(r.status(), 400);
    assert_eq!(
        r.json::<Value>().unwrap(),
        json!({"error": format!("downloading {url}: the file is larger than the 1048576 bytes a \
            pull may download ([server] pull_max_bytes)")})
    );
    // Redirected to `localhost`, a host not in pull_hosts.
    let redirect = format!("{redirector}/redirect.gguf");
    let r = s.post("/api/pull", json!({"model": redirect, "stream": false}));
    assert_eq!(r.status(), 400);
    assert_eq!(
        r.json::<Value>().unwrap(),
        json!({"error": format!("cannot pull '{redirect}': not found or not allowed; pulls may \
            download only from the hosts of [server] pull_hosts")})
    );
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A pull under a new name never replaces the file another model is served
/// from: a different file of the same name lands beside it.
#[test]
fn pulls_never_overwrite_a_served_file() {
    let dir = empty_dir("overwrite");
    let other = empty_dir("overwrite-src");
    // The same file name, other bytes: SmolLM2 with its last byte changed.
    let mut bytes = std::fs::read(common::smollm2()).unwrap();
    *bytes.last_mut().unwrap() ^= 0xff;
    std::fs::write(other.join("smol.gguf"), &bytes).unwrap();
    let original_path = dir.join("smol.gguf");
    std::fs::copy(common::smollm2(), &original_path).unwrap();

    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let served = other.join("smol.gguf");
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf);
            let body = std::fs::read(&served).unwrap();
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(&body);
        }
    });
    let config = config_file(
        "overwrite",
        "[server]\npull_hosts = [\"127.0.0.1\"]\npull_allow_private = true\n",
    );
    let s = start_with_config(
        &config,
        &[
            "--models-dir",
            dir.to_str().unwrap(),
            original_path.to_str().unwrap(),
        ],
    );
    let before = std::fs::read(&original_path).unwrap();
    let r = s.post(
        "/api/pull",
        json!({"model": format!("{base}/smol.gguf"), "name": "other:latest", "stream": false}),
    );
    assert_eq!(r.status(), 200, "{}", r.text().unwrap());
    assert_eq!(std::fs::read(&original_path).unwrap(), before);
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(
        names
            .iter()
            .any(|n| n.starts_with("smol-") && n.ends_with(".gguf")),
        "{names:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&other);
}

/// Temporary files of downloads whose process died are removed at start;
/// those of a live process are kept.
#[test]
fn stale_part_files_are_removed_at_start() {
    let dir = empty_dir("parts");
    let dead = (4_000_000..4_100_000)
        .find(|pid| !Path::new(&format!("/proc/{pid}")).exists())
        .unwrap();
    let stale = dir.join(format!(".smol.gguf.{dead}.0.part"));
    let stale_wheel = dir.join(format!(".SmolLM2.gguf.{dead}.whl"));
    let live = dir.join(format!(".smol.gguf.{}.0.part", std::process::id()));
    for path in [&stale, &stale_wheel, &live] {
        std::fs::write(path, b"partial").unwrap();
    }
    let _s = Server::start(&["--models-dir", dir.to_str().unwrap()]);
    assert!(!stale.exists());
    assert!(!stale_wheel.exists());
    assert!(live.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The served OpenAPI document lists the statuses the layers answer.
#[test]
fn the_document_lists_the_refusals() {
    let s = Server::start(&[]);
    let doc: Value = s.get("/openapi.json").json().unwrap();
    for code in ["400", "401", "403", "413", "503"] {
        assert!(
            doc["paths"]["/api/generate"]["post"]["responses"]
                .get(code)
                .is_some(),
            "{code}"
        );
    }
}
