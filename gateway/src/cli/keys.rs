//! `hypura keys add|list|remove`: the named keys of a keys file
//! ([`crate::tenancy::keys`]). A server reads the file again when it
//! changes, so a key added here works at once.
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};

use crate::tenancy::keys::{
    check_name, entry_toml, generate_key, hash_key, is_json, remove_entry_toml, Globs, KeyEntry,
    KeySet, Limits, Priority, Role,
};

#[derive(Args, Debug)]
pub struct KeysArgs {
    #[command(subcommand)]
    command: KeysCommand,
}

#[derive(Subcommand, Debug)]
enum KeysCommand {
    /// Add a key and print it (once: the file keeps only its hash).
    Add(AddArgs),
    /// List the keys: names, roles, models, limits (never the keys).
    #[command(visible_alias = "ls")]
    List(FileArg),
    /// Remove a key by name.
    #[command(visible_alias = "rm")]
    Remove(RemoveArgs),
}

#[derive(Args, Debug)]
struct FileArg {
    /// The keys file (TOML), as `hypura serve --keys-file` reads it.
    #[arg(long, env = "HYPURA_KEYS_FILE")]
    file: PathBuf,
}

#[derive(Args, Debug)]
struct AddArgs {
    /// The key's name: its label in /metrics and /api/usage.
    name: String,
    #[command(flatten)]
    file: FileArg,
    #[arg(long, value_enum, default_value = "user")]
    role: RoleArg,
    /// Models it may use (a glob such as `llama*`; repeat for more). Default: all.
    #[arg(long = "models", value_name = "GLOB")]
    models: Vec<String>,
    /// Requests per minute.
    #[arg(long)]
    rpm: Option<u32>,
    /// Tokens (prompt and generated) per minute.
    #[arg(long)]
    tpm: Option<u64>,
    /// Requests waiting or running at once.
    #[arg(long)]
    concurrent: Option<u32>,
    /// Most tokens of a request's prompt and reply together, on every route.
    #[arg(long)]
    max_context: Option<u32>,
    /// Most tokens of one reply.
    #[arg(long)]
    max_tokens: Option<u32>,
    /// Share of a model's slots against other users (default 1).
    #[arg(long)]
    weight: Option<f64>,
    /// `batch` work takes only slots that no interactive request waits for.
    #[arg(long, value_enum)]
    priority: Option<PriorityArg>,
}

#[derive(Args, Debug)]
struct RemoveArgs {
    name: String,
    #[command(flatten)]
    file: FileArg,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum RoleArg {
    User,
    Admin,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum PriorityArg {
    Interactive,
    Batch,
}

pub fn keys(args: KeysArgs) -> anyhow::Result<()> {
    match args.command {
        KeysCommand::Add(args) => add(args),
        KeysCommand::List(args) => list(&args),
        KeysCommand::Remove(args) => remove(&args.name, &args.file.file),
    }
}

const HEADER: &str = "# hypura keys file: named API keys, stored as SHA-256 hashes.\n\
# Managed with `hypura keys add|list|remove`; read by `hypura serve --keys-file`\n\
# (again on SIGHUP and whenever it changes). See docs/tenancy.md.\n";

fn add(args: AddArgs) -> anyhow::Result<()> {
    let path = &args.file.file;
    if is_json(path) {
        bail!("`hypura keys add` writes TOML keys files: give a path that does not end in .json");
    }
    check_name(&args.name).map_err(anyhow::Error::msg)?;
    let existing = KeySet::load(path).map_err(anyhow::Error::msg)?;
    if existing.tenants.iter().any(|t| *t.name == *args.name) {
        bail!(
            "{} already has a key named {}: remove it first (`hypura keys remove {}`)",
            path.display(),
            args.name,
            args.name
        );
    }
    let key = generate_key().context("reading random bytes for the key")?;
    let entry = KeyEntry {
        name: args.name.clone(),
        hash: hash_key(&key),
        role: match args.role {
            RoleArg::User => Role::User,
            RoleArg::Admin => Role::Admin,
        },
        models: (!args.models.is_empty()).then(|| Globs::Many(args.models.clone())),
        limits: Limits {
            rpm: args.rpm,
            tpm: args.tpm,
            concurrent: args.concurrent,
            max_context: args.max_context,
            max_tokens: args.max_tokens,
        },
        weight: args.weight,
        priority: args.priority.map(|p| match p {
            PriorityArg::Interactive => Priority::Interactive,
            PriorityArg::Batch => Priority::Batch,
        }),
    };
    let text = entry_toml(&entry);
    // Checked as the server will read it before it is written.
    KeySet::parse(&text, false).map_err(anyhow::Error::msg)?;
    append(path, &text)?;
    eprintln!(
        "added the key {} to {} (shown once; the file keeps its hash):",
        args.name,
        path.display()
    );
    println!("{key}");
    Ok(())
}

fn append(path: &Path, text: &str) -> anyhow::Result<()> {
    let new = !path.exists();
    let mut options = std::fs::OpenOptions::new();
    options.create(true).append(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    let mut file = options
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    if new {
        file.write_all(HEADER.as_bytes())?;
    }
    file.write_all(text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

fn list(file: &FileArg) -> anyhow::Result<()> {
    let set = KeySet::load(&file.file).map_err(anyhow::Error::msg)?;
    if set.is_empty() {
        eprintln!("no keys in {}", file.file.display());
        return Ok(());
    }
    println!(
        "{:<20} {:<6} {:<12} {:<7} {:<20} LIMITS",
        "NAME", "ROLE", "PRIORITY", "WEIGHT", "MODELS"
    );
    for t in &set.tenants {
        let l = &t.limits;
        let limits: Vec<String> = [
            ("rpm", l.rpm.map(u64::from)),
            ("tpm", l.tpm),
            ("concurrent", l.concurrent.map(u64::from)),
            ("max_context", l.max_context.map(u64::from)),
            ("max_tokens", l.max_tokens.map(u64::from)),
        ]
        .iter()
        .filter_map(|(name, v)| v.map(|v| format!("{name}={v}")))
        .collect();
        let models = if t.models.is_empty() {
            "*".to_string()
        } else {
            t.models.join(",")
        };
        println!(
            "{:<20} {:<6} {:<12} {:<7} {:<20} {}",
            t.name,
            t.role.as_str(),
            t.priority.as_str(),
            t.weight,
            models,
            if limits.is_empty() {
                "-".to_string()
            } else {
                limits.join(" ")
            }
        );
    }
    Ok(())
}

fn remove(name: &str, path: &Path) -> anyhow::Result<()> {
    if is_json(path) {
        bail!("`hypura keys remove` edits TOML keys files: edit a JSON one by hand");
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let Some(left) = remove_entry_toml(&text, name) else {
        bail!("{} has no key named {name}", path.display());
    };
    KeySet::parse(&left, false).map_err(anyhow::Error::msg)?;
    let temporary = path.with_extension("toml.tmp");
    std::fs::write(&temporary, left).with_context(|| format!("writing {}", temporary.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(0o600))?;
    }
    std::fs::rename(&temporary, path).with_context(|| format!("replacing {}", path.display()))?;
    eprintln!("removed the key {name} from {}", path.display());
    Ok(())
}
