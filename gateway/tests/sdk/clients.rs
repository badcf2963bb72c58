//! Runs the Python client tests (`gateway/tests/clients/`, the real `ollama`,
//! `openai`, `anthropic`, `langchain-openai` and `langchain-ollama` packages)
//! against this build's `hypura` binary.
use std::path::Path;
use std::process::Command;

#[test]
fn python_clients() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let model = hypura_gguf::testing::smollm2();
    let have = Command::new("python3")
        .args([
            "-c",
            "import ollama, openai, anthropic, pytest, langchain_ollama, langchain_openai",
        ])
        .status();
    assert!(
        have.is_ok_and(|s| s.success()),
        "the client tests need python3 with: python3 -m pip install -r gateway/tests/clients/requirements.txt"
    );
    let status = Command::new("python3")
        .args([
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "gateway/tests/clients",
        ])
        .current_dir(&root)
        .env("HYPURA_BIN", env!("CARGO_BIN_EXE_hypura"))
        .env("HYPURA_TEST_MODEL", &model)
        .status()
        .expect("run pytest");
    assert!(
        status.success(),
        "the Python client tests failed: {status:?}"
    );
}
