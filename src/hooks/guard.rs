//! Where hooks may go (SSRF guard). A hook URL must be http(s); every
//! address that is not globally reachable (loopback, unspecified, private,
//! shared, link-local and metadata, documentation, benchmarking, reserved,
//! multicast, IPv6 unique-local and site-local, ...), and every IPv6 form
//! that carries such an IPv4 address, is refused unless
//! `TXGATE_HOOK_ALLOW` matches the destination. At submit time only
//! literal addresses and `localhost` names are known (no DNS lookup);
//! [`forbidden`] is also what the sender checks each resolved address
//! against.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use url::{Host, Url};

use crate::document::rules::Invalid;

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

/// Longest destination URL.
const MAX_URL: usize = 2048;

/// Why a hook destination was refused.
#[derive(Debug)]
pub enum Refused {
    /// Not an http(s) URL with a plain host.
    Invalid(Invalid),
    /// A URL the guard does not allow (`why`), at `pointer` in the request.
    NotAllowed { pointer: String, why: String },
}

impl HookGuard {
    /// Webhook destination `url` (at `pointer`), checked: an http(s) URL with
    /// a host name of letters, digits, `-` and `.` (or an IP address) that the
    /// destination guard allows.
    pub fn destination(&self, url: &str, pointer: &str) -> Result<Url, Refused> {
        if url.len() > MAX_URL {
            return Err(Refused::Invalid(Invalid::new(pointer, format!("a URL has at most {MAX_URL} characters"))));
        }
        let bytes = url.as_bytes();
        let bad_escape = bytes.iter().enumerate().any(|(i, b)| {
            *b == b'%'
                && !(bytes.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                    && bytes.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
        });
        if bad_escape {
            return Err(Refused::Invalid(Invalid::new(
                pointer,
                "not a URL: '%' must start a percent-escape of two hex digits",
            )));
        }
        let parsed = Url::parse(url).map_err(|e| Refused::Invalid(Invalid::new(pointer, format!("not a URL: {e}"))))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(Refused::Invalid(Invalid::new(pointer, "the URL must be http or https with a host")));
        }
        match parsed.host() {
            None => return Err(Refused::Invalid(Invalid::new(pointer, "the URL must be http or https with a host"))),
            Some(Host::Domain(name)) if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.') => {
                return Err(Refused::Invalid(Invalid::new(
                    pointer,
                    "a host name has only letters, digits, '-' and '.'",
                )));
            }
            Some(_) => {}
        }
        if let Err(why) = self.check_url(&parsed) {
            return Err(Refused::NotAllowed { pointer: pointer.to_owned(), why });
        }
        Ok(parsed)
    }

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

/// Whether `ip` is a destination hooks may not reach unless allowed: every
/// address the IANA special-purpose registries (RFC 6890 and its updates)
/// mark as not globally reachable, multicast and broadcast, and every IPv6
/// address that carries an IPv4 address which is itself refused.
pub(crate) fn forbidden(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => forbidden_v6(v6),
    }
}

/// IPv4 blocks that are not globally reachable (or not unicast).
const V4_REFUSED: &[(u32, u32)] = &[
    (0x0000_0000, 8),  // 0.0.0.0/8 "this network"
    (0x0a00_0000, 8),  // 10.0.0.0/8 private
    (0x6440_0000, 10), // 100.64.0.0/10 shared address space
    (0x7f00_0000, 8),  // 127.0.0.0/8 loopback
    (0xa9fe_0000, 16), // 169.254.0.0/16 link-local, cloud metadata
    (0xac10_0000, 12), // 172.16.0.0/12 private
    (0xc000_0000, 24), // 192.0.0.0/24 IETF protocol assignments
    (0xc000_0200, 24), // 192.0.2.0/24 documentation
    (0xc058_6300, 24), // 192.88.99.0/24 6to4 relay anycast (deprecated)
    (0xc0a8_0000, 16), // 192.168.0.0/16 private
    (0xc612_0000, 15), // 198.18.0.0/15 benchmarking
    (0xc633_6400, 24), // 198.51.100.0/24 documentation
    (0xcb00_7100, 24), // 203.0.113.0/24 documentation
    (0xe000_0000, 4),  // 224.0.0.0/4 multicast
    (0xf000_0000, 4),  // 240.0.0.0/4 reserved, 255.255.255.255 broadcast
];

fn within(addr: u128, net: u128, len: u32, bits: u32) -> bool {
    let shift = bits - len;
    len == 0 || (addr >> shift) == (net >> shift)
}

fn forbidden_v4(ip: Ipv4Addr) -> bool {
    let addr = u128::from(u32::from(ip));
    V4_REFUSED.iter().any(|&(net, len)| within(addr, u128::from(net), len, 32))
}

/// Blocks of the global unicast space (2000::/3) that are not globally
/// reachable; everything outside 2000::/3 is refused, bar the forms that
/// carry an IPv4 address.
const V6_REFUSED: &[(u128, u32)] = &[
    (0x2001_0000_0000_0000_0000_0000_0000_0000, 23), // 2001::/23 IETF protocol assignments
    (0x2001_0db8_0000_0000_0000_0000_0000_0000, 32), // 2001:db8::/32 documentation
    (0x3fff_0000_0000_0000_0000_0000_0000_0000, 20), // 3fff::/20 documentation
];

/// Globally reachable blocks inside [`V6_REFUSED`] ones.
const V6_GLOBAL_EXCEPTIONS: &[(u128, u32)] = &[
    (0x2001_0001_0000_0000_0000_0000_0000_0001, 128), // PCP anycast
    (0x2001_0001_0000_0000_0000_0000_0000_0002, 128), // TURN anycast
    (0x2001_0003_0000_0000_0000_0000_0000_0000, 32),  // AMT
    (0x2001_0004_0112_0000_0000_0000_0000_0000, 48),  // AS112-v6
    (0x2001_0020_0000_0000_0000_0000_0000_0000, 28),  // ORCHIDv2
    (0x2001_0030_0000_0000_0000_0000_0000_0000, 28),  // drone remote ID
];

fn v4_at(addr: u128, shift: u32) -> Ipv4Addr {
    Ipv4Addr::from((addr >> shift) as u32)
}

/// The IPv4 address an IPv6 address carries, for the forms that carry one:
/// IPv4-mapped (`::ffff:0:0/96`), IPv4-compatible (`::/96`),
/// IPv4-translated (`::ffff:0:0:0/96`), NAT64 (`64:ff9b::/96`), 6to4
/// (`2002::/16`) and Teredo (`2001::/32`, the client's address).
pub(crate) fn carried_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let addr = u128::from(ip);
    let is = |net: u128, len: u32| within(addr, net, len, 128);
    if is(0xffff_0000_0000, 96) || is(0, 96) || is(0xffff_0000_0000_0000, 96) || is(0x0064_ff9b << 96, 96) {
        Some(v4_at(addr, 0))
    } else if is(0x2002 << 112, 16) {
        Some(v4_at(addr, 80))
    } else if is(0x2001_0000 << 96, 32) {
        Some(Ipv4Addr::from(!(addr as u32)))
    } else {
        None
    }
}

fn forbidden_v6(ip: Ipv6Addr) -> bool {
    if ip.is_unspecified() || ip.is_loopback() {
        return true;
    }
    if let Some(v4) = carried_v4(ip) {
        return forbidden_v4(v4);
    }
    let addr = u128::from(ip);
    let is = |&(net, len): &(u128, u32)| within(addr, net, len, 128);
    // Outside 2000::/3: discard-only, ULA, link- and site-local,
    // multicast, SRv6, NAT64 local use, and everything unassigned.
    !is(&(0x2000 << 112, 3)) || (V6_REFUSED.iter().any(is) && !V6_GLOBAL_EXCEPTIONS.iter().any(is))
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
            "http://[::127.0.0.1]/",
            "http://[::ffff:0:7f00:1]/",
            "http://[64:ff9b:1::a00:1]/",
            "http://[2002:7f00:1::]/",
            "http://[2002:a9fe:a9fe::1]/",
            "http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/", // Teredo, client 127.0.0.1
            "http://[fec0::1]/",
            "http://[ff02::1]/",
            "http://[100::1]/",
            "http://[2001:db8::1]/",
            "http://[3fff::1]/",
            "http://[2001:2::1]/",
            "http://198.18.0.1/",
            "http://198.19.255.255/",
            "http://192.0.0.8/",
            "http://192.0.2.1/",
            "http://240.0.0.1/",
            "http://255.255.255.255/",
            "http://224.0.0.1/",
            "http://localhost:8080/",
            "http://api.localhost/",
            "http://LOCALHOST./",
            "http://2130706433/", // 127.0.0.1 written as a number
        ] {
            assert!(!check(&g, bad), "{bad} must be refused");
        }
        for good in [
            "https://example.com/hook",
            "http://93.184.216.34/",
            "http://172.32.0.1/",
            "http://198.20.0.1/",
            "http://[2606:4700::1111]/",
            "http://[::ffff:93.184.216.34]/",
            "http://[64:ff9b::5db8:d822]/",
            "http://[2002:5db8:d822::1]/",
            "http://[2001:4:112::1]/",
        ] {
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
