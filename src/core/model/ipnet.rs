//! Address ranges (CIDR) for `ip` conditions and blacklist entries.
//!
//! A value is an address (`10.1.2.3`, `2001:db8::1`) or a network
//! (`10.0.0.0/8`, `2001:db8::/32`). Everything is kept in the IPv6 form
//! the matcher keys on ([`IpKey`](crate::core::table::IpKey)): IPv4 as
//! v4-mapped IPv6, so an IPv4 `/n` is the IPv6 prefix `/96+n` and
//! IPv4-mapped IPv6 *is* IPv4 (`::ffff:10.0.0.0/104` = `10.0.0.0/8`). An
//! exact address is the `/32` (`/128`) case of the same thing and is
//! written without a prefix.
//!
//! A network whose address has bits set past the prefix (`10.1.2.3/8`) is
//! **refused**, naming the network it would be (`10.0.0.0/8`): such a
//! value is more likely a typo for a narrower range than a request for the
//! wider one, and silently widening a limit or a block is the worse error.
//!
//! Matching cost: the table and the blacklist keep one hash set per prefix
//! length in use and probe each with the request's address masked to that
//! length — one probe per distinct prefix length, never a walk over
//! ranges or a bit-by-bit trie walk (the tuple-space classifier of Open
//! vSwitch; APISIX's `ipmatcher` does the same).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The v4-mapped prefix `::ffff:0:0/96`.
const V4_MAPPED: u128 = 0xffff_0000_0000;

/// Why a value is not a usable address or network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IpNetError {
    /// Neither `address` nor `address/length` with an address std parses.
    NotAnAddress,
    /// `max` is 32 for IPv4, 128 for IPv6.
    BadPrefix { len: String, max: u8 },
    /// Refused rather than canonicalised (see the module documentation);
    /// `len` as written, `network` the value without the host bits.
    HostBits { len: u8, network: String },
}

impl std::error::Error for IpNetError {}

impl fmt::Display for IpNetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IpNetError::NotAnAddress => f.write_str("not an IPv4 or IPv6 address or network"),
            IpNetError::BadPrefix { len, max } => {
                write!(f, "prefix length {len:?} is not a number from 0 to {max}")
            }
            IpNetError::HostBits { len, network } => write!(
                f,
                "host bits are set past the /{len} prefix; the network is {network}"
            ),
        }
    }
}

/// An address range: `addr` (IPv6 form, IPv4 v4-mapped) with only its
/// first `len` bits set, `len` in 0..=128 counted over the IPv6 form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpNet {
    pub addr: u128,
    pub len: u8,
}

/// The mask of the first `len` bits of an IPv6 address.
#[inline]
pub fn prefix_mask(len: u8) -> u128 {
    match len {
        0 => 0,
        l if l >= 128 => u128::MAX,
        l => u128::MAX << (128 - l),
    }
}

impl IpNet {
    /// One exact address.
    pub fn host(addr: u128) -> IpNet {
        IpNet { addr, len: 128 }
    }

    /// Is this one exact address (`/32`, `/128`)?
    pub fn is_host(&self) -> bool {
        self.len == 128
    }

    /// Does the range hold `addr` (IPv6 form)?
    #[inline]
    pub fn contains(&self, addr: u128) -> bool {
        addr & prefix_mask(self.len) == self.addr
    }

    fn is_v4(&self) -> bool {
        self.len >= 96 && self.addr >> 32 == V4_MAPPED >> 32
    }
}

/// The canonical text: IPv4 dotted quad, IPv6 in RFC 5952 form, IPv4-mapped
/// IPv6 (a prefix of at least 96 bits in `::ffff:0:0/96`) as IPv4; `/len`
/// only for a network.
impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_v4() {
            write!(f, "{}", Ipv4Addr::from(self.addr as u32))?;
            if self.len < 128 {
                write!(f, "/{}", self.len - 96)?;
            }
        } else {
            write!(f, "{}", Ipv6Addr::from(self.addr))?;
            if self.len < 128 {
                write!(f, "/{}", self.len)?;
            }
        }
        Ok(())
    }
}

/// Parses an address or `address/prefix length` (surrounding spaces
/// ignored). See the module documentation for the rules.
pub fn parse_ip_net(value: &[u8]) -> Result<IpNet, IpNetError> {
    let s = std::str::from_utf8(value)
        .map_err(|_| IpNetError::NotAnAddress)?
        .trim();
    let (addr, len) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let ip: IpAddr = addr.parse().map_err(|_| IpNetError::NotAnAddress)?;
    let (addr, max, base) = match ip {
        IpAddr::V4(v4) => (V4_MAPPED | u128::from(u32::from(v4)), 32u8, 96u8),
        IpAddr::V6(v6) => (u128::from(v6), 128, 0),
    };
    let len = match len {
        None => 128,
        Some(l) => {
            let bad = || IpNetError::BadPrefix {
                len: l.to_string(),
                max,
            };
            // Digits only: no sign, no spaces inside.
            if l.is_empty() || l.len() > 3 || !l.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            let n: u8 = l.parse().map_err(|_| bad())?;
            if n > max {
                return Err(bad());
            }
            base + n
        }
    };
    let net = IpNet {
        addr: addr & prefix_mask(len),
        len,
    };
    if net.addr != addr {
        return Err(IpNetError::HostBits {
            len: len - base,
            network: net.to_string(),
        });
    }
    Ok(net)
}

/// An IP address written as text (surrounding spaces ignored): what the
/// model, the blacklist and the matcher read `ip` values with.
pub fn parse_ip(value: &[u8]) -> Option<IpAddr> {
    std::str::from_utf8(value).ok()?.trim().parse().ok()
}

/// The canonical text of an IP address value: IPv4 dotted quad, IPv6 in
/// RFC 5952 form, IPv4-mapped IPv6 as IPv4, so that one address is stored
/// one way.
pub fn canonical_ip(value: &[u8]) -> Option<String> {
    Some(canonical_ip_addr(parse_ip(value)?))
}

/// Is `value` an IP address in the form [`canonical_ip`] gives? No
/// allocation: the reader checks every published `ip` value with it.
pub fn is_canonical_ip(value: &[u8]) -> bool {
    use std::io::Write;
    // A dotted quad is canonical if it parses: the whole check.
    if parse_canonical_ipv4(value).is_some() {
        return true;
    }
    let Ok(s) = std::str::from_utf8(value) else {
        return false;
    };
    let Ok(ip) = s.parse::<IpAddr>() else {
        return false;
    };
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    };
    let mut buf = [0u8; 64];
    let mut w = &mut buf[..];
    if write!(w, "{ip}").is_err() {
        return false;
    }
    let n = 64 - w.len();
    buf[..n] == *value
}

/// An IPv4 address in canonical text (what std's `Ipv4Addr` parser
/// accepts: four decimal octets of 1 to 3 digits, none above 255, no
/// leading zero, nothing around them), as its 32-bit value. No UTF-8 pass,
/// no allocation: the reader's path for the `ip` values of a table (most
/// are IPv4 addresses); anything else goes through the general parsers.
pub fn parse_canonical_ipv4(b: &[u8]) -> Option<u32> {
    let mut addr = 0u32;
    let mut i = 0;
    for octet in 0..4 {
        if octet > 0 {
            if b.get(i) != Some(&b'.') {
                return None;
            }
            i += 1;
        }
        let start = i;
        let mut v = 0u32;
        while let Some(&c) = b.get(i) {
            if !c.is_ascii_digit() {
                break;
            }
            if i - start == 3 {
                return None;
            }
            v = v * 10 + u32::from(c - b'0');
            i += 1;
        }
        let n = i - start;
        if n == 0 || v > 255 || (n > 1 && b[start] == b'0') {
            return None;
        }
        addr = addr << 8 | v;
    }
    (i == b.len()).then_some(addr)
}

/// See [`canonical_ip`].
pub fn canonical_ip_addr(ip: IpAddr) -> String {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => v6.to_string(),
        },
        IpAddr::V4(v4) => v4.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(s: &str) -> Result<String, IpNetError> {
        parse_ip_net(s.as_bytes()).map(|n| n.to_string())
    }

    #[test]
    fn canonical_forms() {
        for (input, want) in [
            ("10.0.0.0/8", "10.0.0.0/8"),
            ("10.1.2.3", "10.1.2.3"),
            ("10.1.2.3/32", "10.1.2.3"),
            ("0.0.0.0/0", "0.0.0.0/0"),
            ("::ffff:10.0.0.0/104", "10.0.0.0/8"),
            ("::ffff:10.1.2.3", "10.1.2.3"),
            ("2001:DB8::/32", "2001:db8::/32"),
            ("2001:db8::1/128", "2001:db8::1"),
            ("::/0", "::/0"),
            (" 192.0.2.0/24 ", "192.0.2.0/24"),
        ] {
            assert_eq!(canon(input).as_deref(), Ok(want), "{input}");
        }
        let n = parse_ip_net(b"10.0.0.0/8").unwrap();
        assert_eq!(n.len, 104);
        assert!(n.contains(V4_MAPPED | 0x0aff_ffff));
        assert!(!n.contains(V4_MAPPED | 0x0b00_0000));
        assert!(parse_ip_net(b"::/0").unwrap().contains(V4_MAPPED | 1));
    }

    #[test]
    fn refusals_say_why() {
        assert_eq!(
            canon("10.0.0.1/8").unwrap_err().to_string(),
            "host bits are set past the /8 prefix; the network is 10.0.0.0/8"
        );
        assert!(canon("2001:db8::1/32")
            .unwrap_err()
            .to_string()
            .ends_with("2001:db8::/32"));
        for bad in [
            "10.0.0.0/33",
            "10.0.0.0/",
            "10.0.0.0/-1",
            "10.0.0.0/+8",
            "::/129",
            "::/ 8",
            "10.0.0.0/8/8",
        ] {
            assert!(
                matches!(canon(bad), Err(IpNetError::BadPrefix { .. })),
                "{bad}"
            );
        }
        for bad in ["10.0.0", "", "a/8"] {
            assert_eq!(canon(bad), Err(IpNetError::NotAnAddress), "{bad}");
        }
    }
}
