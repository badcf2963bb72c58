//! A copy of SmolLM2 whose chat template is Qwen 2.5's (Hermes `<tool_call>`
//! tools), so tool calls run end to end on the small model: written to a
//! temporary directory, removed when dropped.
use std::path::{Path, PathBuf};

use llama_tiered::llama::gguf_write::{GgufBuilder, GgufReader};

/// Qwen/Qwen2.5-*-Instruct's template.
pub const QWEN_2_5: &str = include_str!("../../../chat/fixtures/qwen2.5-instruct.jinja");

/// The copy's model name.
pub const QWEN_MODEL: &str = "smollm2-qwen-tools:latest";

/// Copies the GGUF `src` to `dst` with `tokenizer.chat_template` replaced;
/// every other key-value and every tensor byte is kept.
pub fn copy_with_template(src: &Path, dst: &Path, template: &str) {
    let reader = GgufReader::open(src).expect("open the source GGUF");
    let mut builder = GgufBuilder::new();
    builder.copy_kvs_from(&reader).unwrap();
    builder
        .set_str("tokenizer.chat_template", template)
        .unwrap();
    let tensors = reader.tensors();
    for t in &tensors {
        builder.add_tensor(&t.name, t.ty, &t.dims).unwrap();
    }
    let mut writer = builder.create(dst).expect("create the copy");
    for t in &tensors {
        writer.write_data(&reader.read_tensor(t).unwrap()).unwrap();
    }
    writer.finish().unwrap();
}

/// SmolLM2 with Qwen 2.5's template, in a directory of its own.
pub struct QwenCopy {
    pub path: PathBuf,
}

impl QwenCopy {
    /// `tag` keeps test files running at once apart.
    pub fn new(tag: &str) -> QwenCopy {
        let dir = std::env::temp_dir().join(format!("hypura-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("smollm2-qwen-tools.gguf");
        copy_with_template(&super::smollm2(), &path, QWEN_2_5);
        QwenCopy { path }
    }
}

impl Drop for QwenCopy {
    fn drop(&mut self) {
        if let Some(dir) = self.path.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
