//! Rate-limit response headers, in the styles clients parse
//! (`rate_ctl_headers off | on | legacy | draft;`). Formatting only, no
//! nginx: the module pushes what [`rate_limit_headers`] returns.
//!
//! | style | headers (values of the tightest applying strategy) |
//! |---|---|
//! | `on` | `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` (seconds until the quota is full again) — the IETF draft up to -06 |
//! | `legacy` | `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` — GitHub/Twitter style names; Reset is **seconds until reset**, not a Unix time |
//! | `draft` | `RateLimit-Policy: "7";q=100;w=1` and `RateLimit: "7";r=99;t=1` — the current draft's structured fields (draft-ietf-httpapi-ratelimit-headers), the strategy id as the policy name |
//!
//! In every style: `Retry-After` (seconds) on a rejection, the remaining
//! count always present (0 on a rejection), and the reset (`t`) never 0:
//! at least 1 s, so no client is told to retry at once.

use std::io::Write;

use super::limiter::Quota;

/// `rate_ctl_headers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeaderStyle {
    #[default]
    Off,
    On,
    Legacy,
    Draft,
}

impl HeaderStyle {
    /// The directive's argument; `None` for anything else.
    pub fn parse(arg: &[u8]) -> Option<HeaderStyle> {
        Some(match arg {
            b"off" => HeaderStyle::Off,
            b"on" => HeaderStyle::On,
            b"legacy" => HeaderStyle::Legacy,
            b"draft" => HeaderStyle::Draft,
            _ => return None,
        })
    }

    pub const EXPECTED: &'static str = "off, on, legacy, draft";
}

/// Longest value we format (a policy item with three 20-digit numbers).
const VALUE_CAP: usize = 96;

/// One response header: a static name and a value formatted on the stack.
#[derive(Clone, Copy)]
pub struct Header {
    pub name: &'static str,
    buf: [u8; VALUE_CAP],
    len: usize,
}

impl Header {
    fn new(name: &'static str, args: std::fmt::Arguments) -> Header {
        let mut buf = [0u8; VALUE_CAP];
        let mut cur = std::io::Cursor::new(&mut buf[..]);
        // Cannot overflow: the longest value is well under VALUE_CAP.
        let _ = cur.write_fmt(args);
        let len = cur.position() as usize;
        Header { name, buf, len }
    }

    pub fn value(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl std::fmt::Debug for Header {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {}",
            self.name,
            String::from_utf8_lossy(self.value())
        )
    }
}

/// Seconds, rounded up, never 0.
fn secs(ns: u64) -> u64 {
    ns.div_ceil(1_000_000_000).max(1)
}

/// The headers of `style` for the tightest quota (`id`, `q`), plus
/// `Retry-After` when the request was rejected (`retry_after_ns`). At most
/// four; none for [`HeaderStyle::Off`].
pub fn rate_limit_headers(
    style: HeaderStyle,
    tightest: Option<(u32, Quota)>,
    retry_after_ns: Option<u64>,
) -> ([Option<Header>; 4], usize) {
    let mut out = [None; 4];
    let mut n = 0;
    let mut push = |h: Header| {
        out[n] = Some(h);
        n += 1;
    };
    if style == HeaderStyle::Off {
        return (out, 0);
    }
    if let Some((id, q)) = tightest {
        // A rejected request has nothing remaining, whatever another
        // strategy's quota says.
        let remaining = if retry_after_ns.is_some() {
            0
        } else {
            q.remaining
        };
        let reset = secs(q.reset_ns);
        match style {
            HeaderStyle::Off => {}
            HeaderStyle::On | HeaderStyle::Legacy => {
                let [l, r, t] = if style == HeaderStyle::On {
                    ["RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"]
                } else {
                    [
                        "X-RateLimit-Limit",
                        "X-RateLimit-Remaining",
                        "X-RateLimit-Reset",
                    ]
                };
                push(Header::new(l, format_args!("{}", q.limit)));
                push(Header::new(r, format_args!("{remaining}")));
                push(Header::new(t, format_args!("{reset}")));
            }
            HeaderStyle::Draft => {
                if q.window_ns > 0 {
                    push(Header::new(
                        "RateLimit-Policy",
                        format_args!("\"{id}\";q={};w={}", q.limit, secs(q.window_ns)),
                    ));
                } else {
                    push(Header::new(
                        "RateLimit-Policy",
                        format_args!("\"{id}\";q={}", q.limit),
                    ));
                }
                push(Header::new(
                    "RateLimit",
                    format_args!("\"{id}\";r={remaining};t={reset}"),
                ));
            }
        }
    }
    if let Some(ns) = retry_after_ns {
        push(Header::new("Retry-After", format_args!("{}", secs(ns))));
    }
    (out, n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::limiter::q;

    const S: u64 = 1_000_000_000;

    fn texts(style: HeaderStyle, t: Option<(u32, Quota)>, retry: Option<u64>) -> Vec<String> {
        let (h, n) = rate_limit_headers(style, t, retry);
        h[..n].iter().map(|h| format!("{:?}", h.unwrap())).collect()
    }

    #[test]
    fn each_style() {
        let t = Some((7, q(100, 99, S / 10, S)));
        assert!(texts(HeaderStyle::Off, t, None).is_empty());
        assert_eq!(
            texts(HeaderStyle::On, t, None),
            [
                "RateLimit-Limit: 100",
                "RateLimit-Remaining: 99",
                "RateLimit-Reset: 1"
            ]
        );
        assert_eq!(
            texts(HeaderStyle::Legacy, t, Some(S * 3 / 2)),
            [
                "X-RateLimit-Limit: 100",
                "X-RateLimit-Remaining: 0",
                "X-RateLimit-Reset: 1",
                "Retry-After: 2"
            ]
        );
        assert_eq!(
            texts(HeaderStyle::Draft, t, None),
            [
                "RateLimit-Policy: \"7\";q=100;w=1",
                "RateLimit: \"7\";r=99;t=1"
            ]
        );
        // Concurrency: no window.
        assert_eq!(
            texts(HeaderStyle::Draft, Some((3, q(2, 0, 0, 0))), Some(S)),
            [
                "RateLimit-Policy: \"3\";q=2",
                "RateLimit: \"3\";r=0;t=1",
                "Retry-After: 1"
            ]
        );
        // A reset of 0 ns is still 1 s; large numbers fit.
        let big = Some((u32::MAX, q(u64::MAX, u64::MAX, 0, u64::MAX)));
        let d = texts(HeaderStyle::Draft, big, Some(u64::MAX));
        assert_eq!(d.len(), 3);
        assert!(d[1].ends_with(";t=1"), "{d:?}");
        assert_eq!(HeaderStyle::parse(b"legacy"), Some(HeaderStyle::Legacy));
        assert_eq!(HeaderStyle::parse(b"yes"), None);
    }
}
