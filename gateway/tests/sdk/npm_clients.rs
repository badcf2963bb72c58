//! Runs the npm client tests (`gateway/tests/clients-npm/`, the official npm
//! `openai` and `ollama` packages, pinned in its `package.json`) with Node's
//! test runner against a real `hypura serve` with SmolLM2. The packages are
//! installed once into `npm-clients/` of the target directory and reused
//! while the `package.json` is unchanged.
#[path = "../common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::Server;

const TESTS: &[&str] = &["openai.test.mjs", "ollama.test.mjs"];

/// `<target dir>/npm-clients` with the pinned packages installed.
fn installed_packages() -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients-npm");
    let target = Path::new(env!("CARGO_BIN_EXE_hypura"))
        .ancestors()
        .nth(2)
        .expect("the binary lies in <target>/<profile>/");
    let dir = target.join("npm-clients");
    let manifest = std::fs::read(source.join("package.json")).unwrap();
    let installed = std::fs::read(dir.join("package.json")).ok();
    if installed.as_ref() != Some(&manifest) || !dir.join("node_modules").is_dir() {
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("package.json"), &manifest).unwrap();
        let status = Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--loglevel=error"])
            .current_dir(&dir)
            .status()
            .expect("run npm: scripts/install-deps.sh --test installs nodejs and npm");
        assert!(status.success(), "npm install failed: {status:?}");
    }
    for test in TESTS {
        std::fs::copy(source.join(test), dir.join(test)).unwrap();
    }
    dir
}

#[test]
fn npm_clients() {
    let dir = installed_packages();
    let server = Server::start(&["--context", "1024"]);
    let status = Command::new("node")
        .arg("--test")
        .args(TESTS)
        .current_dir(&dir)
        .env("HYPURA_BASE", &server.base)
        .status()
        .expect("run node: scripts/install-deps.sh --test installs nodejs");
    assert!(status.success(), "the npm client tests failed: {status:?}");
}
