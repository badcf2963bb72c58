//! Which web pages and which `Host` names may reach the API.
//!
//! A page a user visits can send requests to `localhost` through their
//! browser. CORS only decides whether the page may *read* the answer: a
//! "simple" POST (`text/plain`, no preflight) still runs. So a request that
//! carries an `Origin` outside the allowed ones is refused with 403 before
//! any handler runs, as Ollama's CORS middleware does; requests without an
//! `Origin` (curl, SDKs, same-origin GETs) pass.
//!
//! DNS rebinding (Ollama's CVE-2024-28224): a page on `evil.example` whose
//! name later resolves to 127.0.0.1 is same-origin with the server as far as
//! the browser knows, but its requests carry `Host: evil.example`. A server
//! on a loopback address answers only loopback `Host`s (`localhost`,
//! `*.localhost`, `127.0.0.0/8`, `::1`, any port), plus `[server]
//! allowed_hosts`. A server on every address (`0.0.0.0`, `::`) listens on
//! loopback too, so it checks `Host` as well, answering besides those the
//! names a LAN gives it: IP literals (no rebinding goes through them), this
//! machine's host name (and `<it>.…`), and names under `.local`, `.lan`,
//! `.internal`, `.home.arpa`.
//!
//! Local origins, allowed by default (Ollama's defaults): `http(s)://`
//! `localhost`, `127.0.0.1`, `[::1]`, `0.0.0.0` on any port; `app://`,
//! `file://`, `tauri://`, `vscode-webview://`, `vscode-file://` pages.
use std::net::IpAddr;

/// Suffixes of the names a LAN's own resolvers give (mDNS, home routers).
const LAN_SUFFIXES: &[&str] = &[".local", ".lan", ".internal", ".home.arpa"];

/// Schemes of desktop-app pages (Electron, Tauri, VS Code) allowed by default.
const APP_SCHEMES: &[&str] = &["app", "file", "tauri", "vscode-webview", "vscode-file"];

/// Host names of the local machine an origin or `Host` may use.
fn is_loopback_name(host: &str) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    if host == "localhost" || host.ends_with(".localhost") {
        return true;
    }
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Splits `host[:port]` (`[v6]:port` too) into the host.
fn host_part(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => authority,
    }
}

/// A pattern as configured: an exact origin or host, `*` anywhere in it
/// standing for any run of characters.
fn glob_match(pattern: &str, text: &str) -> bool {
    let pattern = pattern.to_ascii_lowercase();
    let text = text.to_ascii_lowercase();
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let mut rest = text.as_str();
    for (i, part) in parts.iter().enumerate() {
        if i == 0 {
            let Some(r) = rest.strip_prefix(part) else {
                return false;
            };
            rest = r;
        } else if i == parts.len() - 1 {
            return rest.ends_with(part);
        } else {
            match rest.find(part) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
    }
    true
}

#[derive(Debug, Clone)]
pub struct OriginPolicy {
    /// Configured origins besides the local ones.
    extra_origins: Vec<String>,
    /// Configured `Host` names besides the loopback ones.
    extra_hosts: Vec<String>,
    /// Whether the `Host` header is checked at all.
    check_host: bool,
    /// The server binds every address: LAN names are answered too (this
    /// machine's host name, lower case, with them).
    lan_names: Option<String>,
}

impl OriginPolicy {
    /// `bind`: the address the server binds. The `Host` check is on for a
    /// loopback address and for every address (`0.0.0.0`, `::`, which
    /// include loopback); elsewhere only when `hosts` are configured.
    pub fn new(origins: Vec<String>, hosts: Vec<String>, bind: IpAddr) -> OriginPolicy {
        let check_host = (bind.is_loopback() || bind.is_unspecified() || !hosts.is_empty())
            && !hosts.iter().any(|h| h == "*");
        let lan_names = bind.is_unspecified().then(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|name| name.trim().to_ascii_lowercase())
                .unwrap_or_default()
        });
        OriginPolicy {
            extra_origins: origins,
            extra_hosts: hosts,
            check_host,
            lan_names,
        }
    }

    /// Whether a page of `origin` (the `Origin` header) may call the API;
    /// `host` is the request's `Host` (a page of the server's own origin may).
    pub fn origin_allowed(&self, origin: &str, host: Option<&str>) -> bool {
        let origin = origin.trim();
        if self.extra_origins.iter().any(|p| glob_match(p, origin)) {
            return true;
        }
        let Some((scheme, rest)) = origin.split_once("://") else {
            return false;
        };
        let scheme = scheme.to_ascii_lowercase();
        if APP_SCHEMES.contains(&scheme.as_str()) {
            return true;
        }
        if scheme != "http" && scheme != "https" {
            return false;
        }
        let authority = rest.split('/').next().unwrap_or(rest);
        if host.is_some_and(|h| h.eq_ignore_ascii_case(authority)) {
            return true;
        }
        let name = host_part(authority);
        is_loopback_name(name) || name == "0.0.0.0"
    }

    /// Whether the `Host` header (absent: HTTP/1.0) is one this server answers.
    pub fn host_allowed(&self, host: Option<&str>) -> bool {
        if !self.check_host {
            return true;
        }
        let Some(host) = host else {
            return true;
        };
        let name = host_part(host.trim());
        is_loopback_name(name)
            || self
                .lan_names
                .as_deref()
                .is_some_and(|machine| is_lan_name(name, machine))
            || self
                .extra_hosts
                .iter()
                .any(|p| glob_match(p, name) || glob_match(p, host))
    }
}

/// A name a LAN client may reach a server on every address by: an IP
/// literal, `machine` (this host's name) or a name under it, or a name
/// under one of [`LAN_SUFFIXES`].
fn is_lan_name(name: &str, machine: &str) -> bool {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    let bare = name.trim_start_matches('[').trim_end_matches(']');
    bare.parse::<IpAddr>().is_ok()
        || (!machine.is_empty()
            && (name == machine
                || name
                    .strip_prefix(machine)
                    .is_some_and(|r| r.starts_with('.'))))
        || LAN_SUFFIXES.iter().any(|suffix| name.ends_with(suffix))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_origins_pass_and_others_do_not() {
        let p = OriginPolicy::new(Vec::new(), Vec::new(), LOOPBACK);
        for ok in [
            "http://localhost:3000",
            "https://localhost",
            "http://127.0.0.1:8080",
            "http://[::1]:5173",
            "http://0.0.0.0:11434",
            "app://obsidian.md",
            "tauri://localhost",
            "file://",
            "http://foo.localhost:8080",
        ] {
            assert!(p.origin_allowed(ok, Some("localhost:11434")), "{ok}");
        }
        for bad in [
            "https://evil.example",
            "http://localhost.evil.example",
            "http://127.0.0.1.evil.example",
            "null",
            "chrome-extension://abc",
            "http://192.168.1.5:11434",
        ] {
            assert!(!p.origin_allowed(bad, Some("localhost:11434")), "{bad}");
        }
        // A page of the server's own origin (a LAN address it serves on).
        assert!(p.origin_allowed("http://192.168.1.5:11434", Some("192.168.1.5:11434")));
        let configured = OriginPolicy::new(vec!["https://*.example.com".into()], vec![], LOOPBACK);
        assert!(configured.origin_allowed("https://chat.example.com", None));
        assert!(!configured.origin_allowed("https://example.org", None));
        let any = OriginPolicy::new(vec!["*".into()], vec![], LOOPBACK);
        assert!(any.origin_allowed("https://evil.example", None));
    }

    #[test]
    fn loopback_servers_answer_loopback_hosts_only() {
        let p = OriginPolicy::new(Vec::new(), Vec::new(), LOOPBACK);
        for ok in [
            "localhost",
            "localhost:11434",
            "LOCALHOST:1",
            "127.0.0.1:11434",
            "127.1.2.3",
            "[::1]:11434",
            "app.localhost:80",
        ] {
            assert!(p.host_allowed(Some(ok)), "{ok}");
        }
        assert!(p.host_allowed(None));
        for bad in [
            "evil.example",
            "evil.example:11434",
            "localhost.evil.example",
            "192.168.1.5:11434",
            "0x7f000001",
        ] {
            assert!(!p.host_allowed(Some(bad)), "{bad}");
        }
        let lan = OriginPolicy::new(Vec::new(), Vec::new(), LAN);
        assert!(lan.host_allowed(Some("evil.example")));
        let named = OriginPolicy::new(Vec::new(), vec!["box.lan".into()], LAN);
        assert!(named.host_allowed(Some("box.lan:11434")));
        assert!(!named.host_allowed(Some("evil.example")));
        let any = OriginPolicy::new(Vec::new(), vec!["*".into()], LOOPBACK);
        assert!(any.host_allowed(Some("evil.example")));
    }

    const LOOPBACK: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    const LAN: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 168, 1, 5));

    /// `0.0.0.0` listens on loopback too: a rebinding name is refused there,
    /// the names a LAN uses are not.
    #[test]
    fn servers_on_every_address_check_the_host_too() {
        let every = IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);
        let p = OriginPolicy::new(Vec::new(), Vec::new(), every);
        for ok in [
            "localhost:11434",
            "127.0.0.1",
            "192.168.1.5:11434",
            "[fe80::1]:11434",
            "box.local",
            "box.lan:11434",
            "gpu.internal",
            "box.home.arpa",
        ] {
            assert!(p.host_allowed(Some(ok)), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:11434",
            "lan",
            "local.evil.example",
        ] {
            assert!(!p.host_allowed(Some(bad)), "{bad}");
        }
        assert!(is_lan_name("box", "box") && is_lan_name("box.corp.example", "box"));
        assert!(!is_lan_name("boxes.example", "box") && !is_lan_name("box.example", ""));
        let v6 = OriginPolicy::new(
            Vec::new(),
            Vec::new(),
            IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
        );
        assert!(!v6.host_allowed(Some("evil.example")));
    }
}
