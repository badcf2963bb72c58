//! `hypura rm NAME…`: deletes models from a running server, as `ollama rm`
//! does: each is unloaded first (a loaded model stops now, not at its
//! keep-alive), then its name removed (`DELETE /api/delete`); prints
//! `deleted 'NAME'`. The files stay where they are.
use clap::Args;
use serde_json::json;

use super::Client;

#[derive(Args, Debug)]
pub struct RmArgs {
    /// The models' names (`name[:tag]`).
    #[arg(required = true)]
    names: Vec<String>,
}

pub fn rm(args: RmArgs) -> anyhow::Result<()> {
    let client = Client::from_env()?;
    for name in &args.names {
        // As `ollama rm`: an unload that fails (not loaded, no such model)
        // leaves the delete to say what is wrong.
        let unload = json!({"model": name, "prompt": "", "keep_alive": 0, "stream": false});
        let _ = client.post("/api/generate", &unload);
        client.call(
            reqwest::Method::DELETE,
            "/api/delete",
            &json!({ "model": name }),
        )?;
        println!("deleted '{name}'");
    }
    Ok(())
}
