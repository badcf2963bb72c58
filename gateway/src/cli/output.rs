//! Writing a command's report to stdout.
use std::io::Write;

/// Writes `text` to stdout. A reader that went away (`hypura inspect F |
/// head`) ends the command quietly with status 0, as `cat` does, instead of
/// the panic `print!` raises on a broken pipe.
pub fn emit(text: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        other => Ok(other?),
    }
}
