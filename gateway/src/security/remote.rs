//! The URLs `/api/pull` may download.
//!
//! - Only hosts of `[server] pull_hosts` (default: Hugging Face's; `*` for
//!   any public host); a redirect may go only to an allowed host.
//! - No loopback, private, link-local, shared, multicast or reserved
//!   address, whether written in the URL (`127.0.0.1`, `0x7f000001`,
//!   `[::ffff:127.0.0.1]`) or resolved from a name (every address the name
//!   resolves to is checked, and the connection uses only those), unless
//!   `pull_allow_private`.
//! - At most `pull_max_bytes` (announced or received).
//! - The body must begin with a GGUF header ([`check_gguf_header`]): a
//!   page of HTML stops after its first bytes, which are never echoed.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::Url;

/// Hosts pulls may use when none are configured.
pub const DEFAULT_PULL_HOSTS: &[&str] = &["huggingface.co", "*.huggingface.co", "hf.co", "*.hf.co"];
/// Largest download when none is configured: 256 GiB.
pub const DEFAULT_PULL_MAX_BYTES: u64 = 256 << 30;
/// Bytes of a GGUF header: magic, version, tensor count, key-value count.
pub const GGUF_HEADER_BYTES: usize = 24;
/// Redirects followed at most.
const MAX_REDIRECTS: usize = 5;

#[derive(Debug, Clone)]
pub struct PullPolicy {
    hosts: Vec<String>,
    pub allow_private: bool,
    pub max_bytes: u64,
}

/// A URL refused; says nothing of why beyond "not found or not allowed".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused;

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("not found or not allowed")
    }
}

impl std::error::Error for Refused {}

impl PullPolicy {
    pub fn new(hosts: Vec<String>, allow_private: bool, max_bytes: Option<u64>) -> PullPolicy {
        let hosts = if hosts.is_empty() {
            DEFAULT_PULL_HOSTS.iter().map(|h| h.to_string()).collect()
        } else {
            hosts
        };
        PullPolicy {
            hosts,
            allow_private,
            max_bytes: max_bytes.unwrap_or(DEFAULT_PULL_MAX_BYTES),
        }
    }

    /// Whether `url` may be fetched: http(s), an allowed host, and no
    /// forbidden address written in it (names are checked when resolved).
    pub fn check_url(&self, url: &Url) -> Result<(), Refused> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(Refused);
        }
        let host = url.host().ok_or(Refused)?;
        let (name, ip) = match host {
            url::Host::Domain(d) => (d.to_ascii_lowercase(), None),
            url::Host::Ipv4(ip) => (ip.to_string(), Some(IpAddr::V4(ip))),
            url::Host::Ipv6(ip) => (format!("[{ip}]"), Some(IpAddr::V6(ip))),
        };
        let name = name.trim_end_matches('.');
        if !self.hosts.iter().any(|p| host_matches(p, name)) {
            return Err(Refused);
        }
        if let Some(ip) = ip {
            if !self.allow_private && !is_public(ip) {
                return Err(Refused);
            }
        }
        Ok(())
    }

    /// An HTTP client for one pull: names resolved through
    /// [`GuardedResolver`], redirects only to allowed URLs, no proxy (it
    /// would resolve names where they cannot be checked).
    pub fn client(self: &Arc<Self>, insecure: bool) -> reqwest::Result<reqwest::Client> {
        let policy = Arc::clone(self);
        let redirect = reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() >= MAX_REDIRECTS || policy.check_url(attempt.url()).is_err()
            {
                attempt.error(Refused)
            } else {
                attempt.follow()
            }
        });
        reqwest::Client::builder()
            .user_agent(concat!("hypura/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(30))
            .read_timeout(Duration::from_secs(120))
            .danger_accept_invalid_certs(insecure)
            .no_proxy()
            .redirect(redirect)
            .dns_resolver(Arc::new(GuardedResolver {
                allow_private: self.allow_private,
            }))
            .build()
    }
}

/// `*` alone: any host; `*.example`: its subdomains; else the exact name.
fn host_matches(pattern: &str, host: &str) -> bool {
    let pattern = pattern.trim().trim_end_matches('.').to_ascii_lowercase();
    if pattern == "*" {
        return true;
    }
    match pattern.strip_prefix("*.") {
        Some(domain) => host.ends_with(&format!(".{domain}")),
        None => pattern == host,
    }
}

/// Resolves with the system resolver and refuses a name any of whose
/// addresses is not public, so a name cannot lead a pull into the local
/// network (a rebinding name that answers both is refused too).
struct GuardedResolver {
    allow_private: bool,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let allow_private = self.allow_private;
        let host = name.as_str().to_string();
        Box::pin(async move {
            let refused = || Box::new(Refused) as Box<dyn std::error::Error + Send + Sync>;
            let addrs: Vec<SocketAddr> = match tokio::net::lookup_host((host.as_str(), 0)).await {
                Ok(addrs) => addrs.collect(),
                Err(_) => return Err(refused()),
            };
            if addrs.is_empty() || (!allow_private && addrs.iter().any(|a| !is_public(a.ip()))) {
                return Err(refused());
            }
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}

/// Whether `ip` is a global unicast address: not loopback, private,
/// link-local, shared (CGNAT), unspecified, broadcast, multicast,
/// documentation or reserved; IPv6 forms carrying an IPv4 address are
/// judged by it.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || a == 0
        || (a == 100 && (64..128).contains(&b))
        || (a == 192 && b == 0 && c == 0)
        || (a == 198 && (18..20).contains(&b))
        || a >= 240)
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return is_public_v4(v4);
    }
    let s = ip.segments();
    // ::a.b.c.d (deprecated IPv4-compatible), 64:ff9b::/96 (NAT64), 2002::/16 (6to4).
    if s[..6] == [0, 0, 0, 0, 0, 0] && !(ip.is_loopback() || ip.is_unspecified()) {
        return is_public_v4(Ipv4Addr::new(
            (s[6] >> 8) as u8,
            s[6] as u8,
            (s[7] >> 8) as u8,
            s[7] as u8,
        ));
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return is_public_v4(Ipv4Addr::new(
            (s[6] >> 8) as u8,
            s[6] as u8,
            (s[7] >> 8) as u8,
            s[7] as u8,
        ));
    }
    if s[0] == 0x2002 {
        return is_public_v4(Ipv4Addr::new(
            (s[1] >> 8) as u8,
            s[1] as u8,
            (s[2] >> 8) as u8,
            s[2] as u8,
        ));
    }
    !(ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || (s[0] & 0xfe00) == 0xfc00
        || (s[0] & 0xffc0) == 0xfe80
        || (s[0] & 0xffc0) == 0xfec0
        || (s[0] == 0x2001 && s[1] == 0x0db8))
}

/// Whether `start` (the first bytes of a file) is a GGUF header: the magic,
/// version 2 or 3, and counts of tensors and keys a real model could have.
pub fn check_gguf_header(start: &[u8]) -> bool {
    if start.len() < GGUF_HEADER_BYTES || &start[..4] != b"GGUF" {
        return false;
    }
    let u32_at =
        |i: usize| u32::from_le_bytes([start[i], start[i + 1], start[i + 2], start[i + 3]]);
    let u64_at = |i: usize| u64::from_le_bytes(start[i..i + 8].try_into().unwrap_or([0xff; 8]));
    let version = u32_at(4);
    (2..=3).contains(&version) && u64_at(8) < (1 << 24) && u64_at(16) < (1 << 24)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(hosts: &[&str], allow_private: bool) -> PullPolicy {
        PullPolicy::new(
            hosts.iter().map(|h| h.to_string()).collect(),
            allow_private,
            None,
        )
    }

    #[test]
    fn private_addresses_in_any_spelling_are_refused() {
        let any = policy(&["*"], false);
        for bad in [
            "http://127.0.0.1:11434/x.gguf",
            "http://0x7f000001/x.gguf",
            "http://2130706433/x.gguf",
            "http://127.1/x.gguf",
            "http://0177.0.0.1/x.gguf",
            "http://[::1]/x.gguf",
            "http://[::ffff:127.0.0.1]/x.gguf",
            "http://[::ffff:7f00:1]/x.gguf",
            "http://10.0.0.1/x.gguf",
            "http://192.168.1.1/x.gguf",
            "http://172.16.0.1/x.gguf",
            "http://169.254.169.254/latest/meta-data/x.gguf",
            "http://100.64.0.1/x.gguf",
            "http://0.0.0.0/x.gguf",
            "http://[fe80::1]/x.gguf",
            "http://[fd00::1]/x.gguf",
            "http://[64:ff9b::a00:1]/x.gguf",
            "http://[2002:7f00:1::]/x.gguf",
            "ftp://example.com/x.gguf",
        ] {
            let url = Url::parse(bad).unwrap();
            assert_eq!(any.check_url(&url), Err(Refused), "{bad}");
        }
        for ok in ["https://8.8.8.8/x.gguf", "https://example.com/x.gguf"] {
            assert_eq!(any.check_url(&Url::parse(ok).unwrap()), Ok(()), "{ok}");
        }
        let private = policy(&["127.0.0.1"], true);
        assert_eq!(
            private.check_url(&Url::parse("http://0x7f000001:8080/x.gguf").unwrap()),
            Ok(())
        );
    }

    #[test]
    fn only_allowed_hosts() {
        let default = policy(&[], false);
        for ok in [
            "https://huggingface.co/a/b/resolve/main/x.gguf",
            "https://cdn-lfs.hf.co/x.gguf",
            "https://cas-bridge.xethub.hf.co/x.gguf",
        ] {
            assert_eq!(default.check_url(&Url::parse(ok).unwrap()), Ok(()), "{ok}");
        }
        for bad in [
            "https://example.com/x.gguf",
            "https://huggingface.co.evil.example/x.gguf",
            "https://evilhuggingface.co/x.gguf",
        ] {
            assert_eq!(
                default.check_url(&Url::parse(bad).unwrap()),
                Err(Refused),
                "{bad}"
            );
        }
    }

    #[test]
    fn gguf_headers() {
        let mut header = b"GGUF".to_vec();
        header.extend(3u32.to_le_bytes());
        header.extend(272u64.to_le_bytes());
        header.extend(30u64.to_le_bytes());
        assert!(check_gguf_header(&header));
        assert!(!check_gguf_header(&header[..20]));
        assert!(!check_gguf_header(b"<html><body>Not a model</body></html>"));
        let mut huge = header.clone();
        huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(!check_gguf_header(&huge));
    }

    #[tokio::test]
    async fn names_resolving_to_loopback_are_refused() {
        let guarded = GuardedResolver {
            allow_private: false,
        };
        let name: Name = "localhost".parse().unwrap();
        assert!(guarded.resolve(name).await.is_err());
        let open = GuardedResolver {
            allow_private: true,
        };
        let name: Name = "localhost".parse().unwrap();
        assert!(open.resolve(name).await.is_ok());
    }
}
