//! Where hooks may go (SSRF guard). A hook URL must be http(s); loopback,
//! unspecified, private, shared (100.64/10), link-local and metadata
//! addresses, IPv6 unique-local and link-local, and IPv4 addresses mapped
//! into IPv6, are refused unless `TXGATE_HOOK_ALLOW` matches the
//! destination. At submit time only literal addresses and `localhost` names
//! are known (no DNS lookup); [`forbidden`] is also what the sender checks
//! each resolved address against.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use url::{Host, Url};

/// One `TXGATE_HOOK_ALLOW` pattern: `host`, `host:port`, `*.domain`,
/// `host:*` (`[v6]` for IPv6 literals).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Pattern {
    /// Lower-case host, or `.domain` for a `*.domain` wildcard.
    host: String,
    /// `None`: any port.
    port: Option<u16>,
}

#[derive(Clone, Debug, Default)]
pub struct HookGuard {
    allow: Vec<Pattern>,
}

fn parse_pattern(raw: &str) -> Result<Pattern, String> {
    let bad = || format!("TXGATE_HOOK_ALLOW entry {raw:?} is not host, host:port, *.domain or host:*");
    let (host, port) = if let Some(rest) = raw.strip_prefix('[') {
        let (h, after) = rest.split_once(']').ok_or_else(bad)?;
        (h.to_owned(), after.strip_prefix(':'))
    } else {
        match raw.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h.to_owned(), Some(p)),
            _ => (raw.to_owned(), None),
        }
    };
    let port = match port {
        None | Some("*") => None,
        Some(p) => Some(p.parse::<u16>().map_err(|_| bad())?),
    };
    let host = host.to_ascii_lowercase();
    let host = match host.strip_prefix("*.") {
        Some(domain) if !domain.is_empty() => format!(".{domain}"),
        Some(_) => return Err(bad()),
        None if host.is_empty() || host.contains('*') => return Err(bad()),
        None => host,
    };
    Ok(Pattern { host, port })
}

impl HookGuard {
    /// From the comma-separated `TXGATE_HOOK_ALLOW` value.
    pub fn new(allow: &str) -> Result<Self, String> {
        let allow =
            allow.split(',').map(str::trim).filter(|p| !p.is_empty()).map(parse_pattern).collect::<Result<_, _>>()?;
        Ok(Self { allow })
    }

    /// Whether an allow pattern matches `host` (lower-case; IPv6 without
    /// brackets) and `port`.
    pub fn allowed(&self, host: &str, port: u16) -> bool {
        self.allow.iter().any(|p| {
            let host_ok = match p.host.strip_prefix('.') {
                Some(domain) => host.ends_with(&p.host) && host.len() > domain.len() + 1,
                None => p.host == host,
            };
            host_ok && p.port.is_none_or(|allowed| allowed == port)
        })
    }

    /// The submit-time check of a hook URL; `Err` says why it is refused.
    pub fn check_url(&self, url: &Url) -> Result<(), String> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err("hook URLs must be http or https".into());
        }
        let port = url.port_or_known_default().unwrap_or(0);
        let (name, ip) = match url.host() {
            None => return Err("the hook URL has no host".into()),
            Some(Host::Domain(d)) => {
                let d = d.trim_end_matches('.').to_ascii_lowercase();
                let local = d == "localhost" || d.ends_with(".localhost");
                (d, local.then_some(IpAddr::V4(Ipv4Addr::LOCALHOST)))
            }
            Some(Host::Ipv4(v4)) => (v4.to_string(), Some(IpAddr::V4(v4))),
            Some(Host::Ipv6(v6)) => (v6.to_string(), Some(IpAddr::V6(v6))),
        };
        match ip {
            Some(ip) if forbidden(ip) && !self.allowed(&name, port) => Err(format!(
                "{name} is a loopback, private, link-local or metadata destination; allow it with TXGATE_HOOK_ALLOW"
            )),
            _ => Ok(()),
        }
    }
}

/// Whether `ip` is a destination hooks may not reach unless allowed.
pub fn forbidden(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => forbidden_v6(v6),
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    ip.is_loopback()
        || ip.is_unspecified()
        || a == 0
        || ip.is_private()
        || ip.is_link_local() // 169.254/16, cloud metadata included
        || (a == 100 && (64..128).contains(&b)) // 100.64/10
        || ip.is_broadcast()
        || ip.is_multicast()
}

fn forbidden_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return forbidden_v4(v4);
    }
    let seg = ip.segments();
    // NAT64 (64:ff9b::/96) embeds an IPv4 address.
    if seg[0] == 0x64 && seg[1] == 0xff9b && seg[2..6] == [0, 0, 0, 0] {
        return forbidden_v4(Ipv4Addr::new((seg[6] >> 8) as u8, seg[6] as u8, (seg[7] >> 8) as u8, seg[7] as u8));
    }
    ip.is_loopback()
        || ip.is_unspecified()
        || (seg[0] & 0xfe00) == 0xfc00 // fc00::/7
        || (seg[0] & 0xffc0) == 0xfe80 // fe80::/10
        || ip.is_multicast()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(guard: &HookGuard, url: &str) -> bool {
        guard.check_url(&Url::parse(url).unwrap()).is_ok()
    }

    #[test]
    fn refuses_internal_destinations() {
        let g = HookGuard::default();
        for bad in [
            "http://127.0.0.1/x",
            "http://127.9.9.9/x",
            "http://0.0.0.0/",
            "http://10.1.2.3/",
            "http://172.16.0.1/",
            "http://172.31.255.255/",
            "http://192.168.1.1/",
            "http://100.64.0.1/",
            "http://169.254.169.254/latest/meta-data",
            "http://[::1]/",
            "http://[::]/",
            "http://[fd00::1]/",
            "http://[fe80::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://[::ffff:10.0.0.1]/",
            "http://[64:ff9b::a9fe:a9fe]/",
            "http://localhost:8080/",
            "http://api.localhost/",
            "http://LOCALHOST./",
            "http://2130706433/", // 127.0.0.1 written as a number
        ] {
            assert!(!check(&g, bad), "{bad} must be refused");
        }
        for good in ["https://example.com/hook", "http://93.184.216.34/", "http://172.32.0.1/", "http://[2001:db8::1]/"]
        {
            assert!(check(&g, good), "{good} must be allowed");
        }
    }

    #[test]
    fn allow_patterns() {
        let g = HookGuard::new("localhost:9000, 127.0.0.1:*, *.internal.test, [::1]").unwrap();
        assert!(check(&g, "http://localhost:9000/"));
        assert!(!check(&g, "http://localhost:9001/"));
        assert!(check(&g, "http://127.0.0.1:1234/"));
        assert!(check(&g, "http://[::1]:5/"));
        assert!(!check(&g, "http://10.0.0.1/"));
        assert!(g.allowed("a.internal.test", 80));
        assert!(!g.allowed("internal.test", 80));
        for bad in ["*.", "a:b", "*", "[::1"] {
            assert!(HookGuard::new(bad).is_err(), "{bad}");
        }
    }
}
