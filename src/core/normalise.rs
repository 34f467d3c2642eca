//! Normalised dimension values (issue 30): the flags of
//! `rate_ctl_dimension NAME VALUE [path] [lowercase] [decode] [last]`, as
//! pure byte functions (the module applies them to a request's value, in
//! the request pool, only when [`Normalise::needed`] says the value would
//! change).
//!
//! - `decode`: `%XX` percent-decoded (a `%` not followed by two hex digits
//!   is kept as is; `+` is kept: `$arg_*` is not form-decoded). A value
//!   that decodes to a NUL byte, or is not UTF-8 after decoding, is absent.
//! - `path`: each segment's `;params` dropped (`/login;jsessionid=1` →
//!   `/login`), repeated slashes merged, a trailing `/` dropped except for
//!   the root (`/login/` → `/login`, `/` stays).
//! - `lowercase`: ASCII letters lowered.
//!
//! Applied in that order. A value that becomes empty is absent.

/// Which normalisations a dimension applies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Normalise {
    pub path: bool,
    pub lowercase: bool,
    pub decode: bool,
}

impl Normalise {
    /// Raw bytes (a `rate_ctl_dimension` without flags).
    pub const NONE: Normalise = Normalise {
        path: false,
        lowercase: false,
        decode: false,
    };
    /// The built-in `api`'s default.
    pub const PATH: Normalise = Normalise {
        path: true,
        lowercase: false,
        decode: false,
    };

    pub fn is_none(self) -> bool {
        self == Normalise::NONE
    }

    /// Whether [`apply`](Self::apply) could change `v` (or find it
    /// absent): false for most values, which are then used as they are.
    /// May say true for a value that comes out the same.
    #[inline]
    pub fn needed(self, v: &[u8]) -> bool {
        (self.path && path_needed(v))
            || (self.decode && v.iter().any(|&b| b == b'%' || b >= 0x80))
            || (self.lowercase && v.iter().any(u8::is_ascii_uppercase))
    }

    /// Writes the normalised `v` to `out` (at least `v.len()` bytes: no
    /// normalisation lengthens a value) and returns its length, or `None`
    /// when the value is absent after it (empty, or for `decode` a NUL
    /// byte or bytes that are not UTF-8).
    pub fn apply(self, v: &[u8], out: &mut [u8]) -> Option<usize> {
        if out.len() < v.len() {
            return None;
        }
        let mut n = v.len();
        out[..n].copy_from_slice(v);
        if self.decode {
            n = percent_decode(&mut out[..n]);
            let text = &out[..n];
            if text.contains(&0) || std::str::from_utf8(text).is_err() {
                return None;
            }
        }
        if self.path {
            n = normalise_path(&mut out[..n]);
        }
        if self.lowercase {
            out[..n].make_ascii_lowercase();
        }
        (n > 0).then_some(n)
    }
}

/// Whether a path has a `;`, a repeated slash or a trailing slash (not
/// the root). Short values (the usual URI) are read as two overlapping
/// words, without a loop.
#[inline]
pub fn path_needed(v: &[u8]) -> bool {
    let n = v.len();
    if n > 1 && v[n - 1] == b'/' {
        return true;
    }
    if (4..=8).contains(&n) {
        // Two overlapping 4-byte reads cover every byte and every adjacent
        // pair except across the seam, which the overlap covers when n < 8
        // (for n == 8, bytes 3 and 4 are checked by the scalar test below).
        let word = |b: &[u8]| b.try_into().map_or(0, u32::from_le_bytes) as u64;
        let (lo, hi) = (word(&v[..4]), word(&v[n - 4..]));
        let w = lo | hi << 32;
        let semi = byte_mask(w, b';');
        let slash = byte_mask(w, b'/');
        // Adjacent slashes within each half (the halves' own bytes).
        let pairs = slash & (slash << 8) & !0x0000_0080_0000_0000;
        return semi != 0 || pairs != 0 || (n == 8 && v[3] == b'/' && v[4] == b'/');
    }
    path_needed_scan(v)
}

/// Whether a path of 4 to 8 bytes has neither a `;` nor a trailing `/`
/// (false for any other length: the caller then checks in full). With
/// no `//` known (see the module's `api`), such a path needs no `path`
/// normalisation. Two overlapping 4-byte reads, no loop.
#[inline(always)]
pub fn short_path_plain(v: &[u8]) -> bool {
    let n = v.len();
    if !(4..=8).contains(&n) {
        return false;
    }
    let word = |b: &[u8]| b.try_into().map_or(0, u32::from_le_bytes) as u64;
    let (lo, hi) = (word(&v[..4]), word(&v[n - 4..]));
    byte_mask(lo | hi << 32, b';') == 0 && hi >> 24 != u64::from(b'/')
}

/// [`path_needed`] for values shorter than 4 or longer than 8 bytes.
#[inline(never)]
fn path_needed_scan(v: &[u8]) -> bool {
    v.contains(&b';') || v.windows(2).any(|p| p == b"//")
}

/// The high bit of each byte of `w` that equals `b`, exactly.
#[inline(always)]
fn byte_mask(w: u64, b: u8) -> u64 {
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    let t = w ^ (u64::from(b) * 0x0101_0101_0101_0101);
    !(((t & LOW7) + LOW7) | t | LOW7)
}

/// Percent-decodes `b` in place; returns the new length.
fn percent_decode(b: &mut [u8]) -> usize {
    let hex = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    let (mut r, mut w) = (0, 0);
    while r < b.len() {
        let c = b[r];
        if c == b'%' && r + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[r + 1]), hex(b[r + 2])) {
                b[w] = h << 4 | l;
                w += 1;
                r += 3;
                continue;
            }
        }
        b[w] = c;
        w += 1;
        r += 1;
    }
    w
}

/// Normalises a path in place (see the module docs); returns the new length.
fn normalise_path(b: &mut [u8]) -> usize {
    let (mut r, mut w) = (0, 0);
    let n = b.len();
    while r < n {
        let c = b[r];
        if c == b';' {
            // Skip the parameters up to the next segment.
            while r < n && b[r] != b'/' {
                r += 1;
            }
            continue;
        }
        if c == b'/' && w > 0 && b[w - 1] == b'/' {
            r += 1;
            continue;
        }
        b[w] = c;
        w += 1;
        r += 1;
    }
    if w > 1 && b[w - 1] == b'/' {
        w -= 1;
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(f: Normalise, v: &str) -> Option<String> {
        let mut out = vec![0u8; v.len()];
        let n = f.apply(v.as_bytes(), &mut out)?;
        Some(String::from_utf8_lossy(&out[..n]).into_owned())
    }

    #[test]
    fn paths() {
        let p = Normalise::PATH;
        for (v, want) in [
            ("/login", "/login"),
            ("/login/", "/login"),
            ("/login;jsessionid=1", "/login"),
            ("/a;x/b;y/", "/a/b"),
            ("//a///b//", "/a/b"),
            ("/", "/"),
            ("/;x", "/"),
            ("/a/b", "/a/b"),
        ] {
            assert_eq!(norm(p, v).as_deref(), Some(want), "{v}");
        }
        assert_eq!(norm(p, ";x"), None);
    }

    #[test]
    fn needed_agrees_with_apply() {
        // Every short path of these bytes: when `needed` says no, `apply`
        // leaves it as it is.
        for v in every_path([b'/', b';', b'a', b'B']) {
            for f in [
                Normalise::PATH,
                Normalise {
                    lowercase: true,
                    ..Normalise::PATH
                },
            ] {
                if !f.needed(&v) {
                    let mut out = vec![0u8; v.len()];
                    let n = f.apply(&v, &mut out);
                    assert_eq!(n.map(|n| &out[..n]), Some(&v[..]), "{:?}", v);
                }
            }
        }
    }

    /// Every value of 1 to 10 bytes of `alphabet`.
    fn every_path(alphabet: [u8; 4]) -> impl Iterator<Item = Vec<u8>> {
        (1..=10u32).flat_map(move |len| {
            (0..4usize.pow(len)).map(move |mut k| {
                let mut v = Vec::with_capacity(len as usize);
                for _ in 0..len {
                    v.push(alphabet[k % 4]);
                    k /= 4;
                }
                v
            })
        })
    }

    #[test]
    fn short_path_plain_agrees_with_apply() {
        // Every short path without `//` (what nginx's request line gives
        // the module's quick check): when it says plain, `path` leaves the
        // value as it is; and it says plain for a usual short path.
        for v in every_path([b'/', b';', b'a', b'.']) {
            if v.windows(2).any(|p| p == b"//") || !short_path_plain(&v) {
                continue;
            }
            assert!((4..=8).contains(&v.len()), "{:?}", v);
            let mut out = vec![0u8; v.len()];
            let n = Normalise::PATH.apply(&v, &mut out);
            assert_eq!(n.map(|n| &out[..n]), Some(&v[..]), "{:?}", v);
        }
        assert!(short_path_plain(b"/bench"));
        assert!(short_path_plain(b"/a/b.txt"));
        assert!(!short_path_plain(b"/login/"));
        assert!(!short_path_plain(b"/a;x=1/b"));
        assert!(!short_path_plain(b"/a/b;"));
    }

    #[test]
    fn decode_and_lowercase() {
        let d = Normalise {
            decode: true,
            ..Normalise::NONE
        };
        assert_eq!(norm(d, "a%64min").as_deref(), Some("admin"));
        assert_eq!(norm(d, "100%").as_deref(), Some("100%"));
        assert_eq!(norm(d, "%zz%4").as_deref(), Some("%zz%4"));
        assert_eq!(norm(d, "a%00b"), None);
        assert_eq!(norm(d, "%ff"), None);
        assert_eq!(norm(d, "%c3%a9").as_deref(), Some("é"));
        assert!(d.needed(b"a%64") && !d.needed(b"admin"));
        let l = Normalise {
            lowercase: true,
            decode: true,
            ..Normalise::NONE
        };
        assert_eq!(norm(l, "AD%4Din").as_deref(), Some("admin"));
        assert!(!l.needed(b"admin") && l.needed(b"Admin"));
    }
}
