//! Condition operators beyond exact bytes: prefixes, path templates and
//! negation (issue 30), and how the matcher turns the first two into exact
//! lookups.
//!
//! A condition is `dimension OP value`:
//!
//! | written        | [`Op`]              | matches a request whose value …                         |
//! |----------------|---------------------|---------------------------------------------------------|
//! | `api=/login`   | [`Op::Exact`]       | is these bytes                                           |
//! | `api^=/api/v1/`| [`Op::Prefix`]      | starts with these bytes (the prefix is never empty)       |
//! | `api~=/u/*/o`  | [`Op::Template`]    | has the template's segments (see below)                  |
//! | `userid!=admin`| [`Op::Not`]         | differs from these bytes, **an absent value included**   |
//!
//! In the store, the API and import files a condition is the pair
//! `(key, value)` where the key is the dimension followed by the
//! operator's character (`api^`, `api~`, `userid!`; none for exact): the
//! same split a `--match dim^=value` argument gets at its first `=`.
//!
//! ## Templates
//! A template is split at `/` into segments. A segment that is exactly `*`
//! matches one non-empty segment; a last segment `**` (after a `/`)
//! matches any rest, including none (`/api/**` matches `/api`, `/api/`
//! and `/api/a/b`); every other byte is literal, and a literal `*` or `\`
//! is written `\*` or `\\` (any other use of `*` or `\` is refused, so
//! that each template has one spelling).
//!
//! ## Matching cost
//! The matcher sees a prefix of length `n` as the pseudo-dimension
//! `dim^n` (the request's first `n` bytes) and a template as the
//! pseudo-dimension `dim~shape` (its segment count, wildcard positions and
//! rest flag): the request's value is projected onto the shape — its
//! literal segments kept (escaped), its wildcard segments written `*`,
//! `/**` appended for a rest — and looked up as exact bytes among the
//! templates of that shape. A request therefore costs one probe per prefix
//! length and per template shape in use, whatever the number of strategies,
//! as address ranges cost one probe per prefix length. Negations are
//! checked after the candidates are found (see the `table` module).

/// A condition's operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub enum Op {
    #[default]
    Exact = 0,
    Prefix = 1,
    Template = 2,
    Not = 3,
}

impl Op {
    /// The character after the dimension in a condition's key (`api^`),
    /// empty for exact.
    pub fn suffix(self) -> &'static str {
        match self {
            Op::Exact => "",
            Op::Prefix => "^",
            Op::Template => "~",
            Op::Not => "!",
        }
    }

    /// As written between dimension and value: `=`, `^=`, `~=`, `!=`.
    pub fn symbol(self) -> &'static str {
        match self {
            Op::Exact => "=",
            Op::Prefix => "^=",
            Op::Template => "~=",
            Op::Not => "!=",
        }
    }

    /// The operator stored in the top two bits of a record's
    /// dimension-length byte (docs/SHM-LAYOUT.md).
    pub fn from_bits(b: u8) -> Op {
        match b & 3 {
            0 => Op::Exact,
            1 => Op::Prefix,
            2 => Op::Template,
            _ => Op::Not,
        }
    }

    /// Splits a condition key (`api^`) into dimension and operator.
    pub fn split_key(key: &str) -> (&str, Op) {
        let op = match key.as_bytes().last() {
            Some(b'^') => Op::Prefix,
            Some(b'~') => Op::Template,
            Some(b'!') => Op::Not,
            _ => return (key, Op::Exact),
        };
        (&key[..key.len() - 1], op)
    }
}

/// Most segments a template may have (its wildcards are a bit mask).
pub const MAX_TEMPLATE_SEGMENTS: usize = 32;

/// What a template constrains apart from its literal bytes: the requests
/// of one shape are projected the same way (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    /// Segments before the rest (`/users/*/orders`: 4, the first empty).
    pub segments: u8,
    /// Bit `i`: segment `i` is `*`.
    pub wild: u32,
    /// Ends with `/**`.
    pub rest: bool,
}

impl Shape {
    /// The matcher's pseudo-dimension name for templates of this shape on
    /// `dim` (never a valid dimension name).
    pub fn dimension(&self, dim: &str) -> String {
        format!(
            "{dim}~{}.{:x}{}",
            self.segments,
            self.wild,
            if self.rest { "+" } else { "" }
        )
    }
}

/// The matcher's pseudo-dimension name for prefixes of `len` bytes on `dim`.
pub fn prefix_dimension(dim: &str, len: usize) -> String {
    format!("{dim}^{len}")
}

/// Why a template is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("'*' stands only for a whole segment (write \\* for a literal '*')")]
    Star,
    #[error("'**' is only allowed as the last segment, after a '/'")]
    Rest,
    #[error("'\\' escapes only '*' or '\\'")]
    Escape,
    #[error("at most {MAX_TEMPLATE_SEGMENTS} segments")]
    TooManySegments,
}

/// Checks a template and returns its shape.
pub fn parse_template(t: &[u8]) -> Result<Shape, TemplateError> {
    let (body, rest) = match t.strip_suffix(b"/**") {
        Some(b) => (b, true),
        None => (t, false),
    };
    let mut segments = 0usize;
    let mut wild = 0u32;
    for seg in body.split(|&b| b == b'/') {
        if segments >= MAX_TEMPLATE_SEGMENTS {
            return Err(TemplateError::TooManySegments);
        }
        if seg == b"*" {
            wild |= 1 << segments;
        } else if seg == b"**" {
            return Err(TemplateError::Rest);
        } else {
            let mut i = 0;
            while i < seg.len() {
                match seg[i] {
                    b'\\' => match seg.get(i + 1) {
                        Some(b'*' | b'\\') => i += 1,
                        _ => return Err(TemplateError::Escape),
                    },
                    b'*' => return Err(TemplateError::Star),
                    _ => {}
                }
                i += 1;
            }
        }
        segments += 1;
    }
    Ok(Shape {
        segments: segments as u8,
        wild,
        rest,
    })
}

/// Writes to `out` the key request value `v` has in templates of `shape`
/// (see the module docs), or returns false when `v` cannot match any of
/// them (another segment count, an empty wildcard segment, or a key longer
/// than `limit`, longer than any template). `out` is cleared first; it
/// needs no more than `limit + 3` bytes of capacity. The matcher calls it
/// only for shapes of the value's segment count (or fewer, with a rest).
#[inline]
pub fn project(shape: Shape, v: &[u8], limit: usize, out: &mut Vec<u8>) -> bool {
    out.clear();
    let n = usize::from(shape.segments);
    let mut i = 0usize;
    let mut pos = 0usize;
    loop {
        let end = match v[pos..].iter().position(|&b| b == b'/') {
            Some(e) => pos + e,
            None => v.len(),
        };
        let seg = &v[pos..end];
        if i > 0 {
            out.push(b'/');
        }
        if shape.wild >> i & 1 == 1 {
            if seg.is_empty() {
                return false;
            }
            out.push(b'*');
        } else if out.len() + seg.len() > limit {
            return false;
        } else if seg.iter().any(|&b| b == b'*' || b == b'\\') {
            for &b in seg {
                if b == b'*' || b == b'\\' {
                    out.push(b'\\');
                }
                out.push(b);
            }
            if out.len() > limit {
                return false;
            }
        } else {
            out.extend_from_slice(seg);
        }
        i += 1;
        if i == n {
            // All the shape's segments: the value must end here, unless a
            // rest follows (any, including none).
            // (A rest is not written: template keys are interned
            // without it, see `template_key`.)
            return shape.rest || end == v.len();
        }
        if end == v.len() {
            return false; // fewer segments than the shape
        }
        pos = end + 1;
    }
}

/// Whether `v` matches template `t` (a checked template), the plain
/// definition: for tests and tools, not the request path.
pub fn template_matches(t: &[u8], v: &[u8]) -> bool {
    let Ok(shape) = parse_template(t) else {
        return false;
    };
    let mut out = Vec::new();
    project(shape, v, usize::MAX / 2, &mut out) && out == template_key(t)
}

/// The key a template is interned under in its shape's map: the template
/// without a trailing `/**` (the shape holds the rest flag), so that a
/// template without wildcards is found by the request's own bytes.
pub fn template_key(t: &[u8]) -> &[u8] {
    t.strip_suffix(b"/**").unwrap_or(t)
}

/// How many `/`-separated segments `v` has (its `/`s plus one), as
/// `v.iter().filter(|&&b| b == b'/').count() + 1`: eight bytes at a time
/// (a request's path is counted once per template base; out of line,
/// [`slashes_in_words`]), the last one to seven in two overlapping 4-byte
/// words or bytes.
#[inline(always)]
pub fn segment_count(v: &[u8]) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // The high bit of each byte of `w` that is `/`, no other bit.
    let slashes = |w: u64| {
        let x = w ^ (ONES * u64::from(b'/'));
        !(((x & LOW7) + LOW7) | x) & HIGH
    };
    // How many high bits `m` (of `slashes`) has: no popcnt needed.
    let count = |m: u64| ((m >> 7).wrapping_mul(ONES) >> 56) as usize;
    let words = v.len() & !7;
    let mut n = 1;
    if words > 0 {
        n += slashes_in_words(&v[..words]);
    }
    let rest = &v[words..];
    let r = rest.len();
    if r >= 4 {
        let word = |at: usize| {
            let mut b = [0u8; 4];
            b.copy_from_slice(&rest[at..at + 4]);
            u64::from(u32::from_le_bytes(b))
        };
        // The last word's bytes that `word(0)` already holds (its low
        // `8 - r`) shifted out: the high bytes left are 0, not `/`.
        let hi = word(r - 4) >> (8 * (8 - r));
        n += count(slashes(word(0) | (hi << 32)));
    } else {
        for &b in rest {
            n += usize::from(b == b'/');
        }
    }
    n
}

/// How many `/`s `v` (a whole number of 8-byte words) has, eight bytes at
/// a time: out of line, so that a short value's count (the usual path)
/// carries none of its (vectorised) setup.
#[inline(never)]
fn slashes_in_words(v: &[u8]) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let mut n = 0;
    for w in v.chunks_exact(8) {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        let x = u64::from_le_bytes(b) ^ (ONES * u64::from(b'/'));
        let m = !(((x & LOW7) + LOW7) | x) & HIGH;
        n += ((m >> 7).wrapping_mul(ONES) >> 56) as usize;
    }
    n
}

/// The first `n` segments of `v` (of `segments` segments, at least `n`;
/// no byte to escape): the literal key of a wildcard-free shape
/// ([`literal_key`] without its checks, which the caller made).
#[inline(always)]
pub fn first_segments(v: &[u8], n: usize, segments: usize) -> &[u8] {
    if segments <= n {
        return v;
    }
    // The n-th `/` ends the n-th segment (a rest follows).
    let mut seen = 0usize;
    for (i, &b) in v.iter().enumerate() {
        if b == b'/' {
            seen += 1;
            if seen == n {
                return &v[..i];
            }
        }
    }
    v
}

/// For a shape without wildcards: the key of `v` as a slice of `v` (its
/// first `shape.segments` segments), or `None` when it needs
/// [`project`] (a byte to escape) — or cannot match: then `project`
/// says so.
#[inline]
pub fn literal_key(shape: Shape, v: &[u8]) -> Option<&[u8]> {
    let n = usize::from(shape.segments);
    let mut seen = 0usize;
    let mut end = v.len();
    for (i, &b) in v.iter().enumerate() {
        if b == b'/' {
            seen += 1;
            if seen == n {
                end = i;
                break;
            }
        } else if b == b'*' || b == b'\\' {
            return None;
        }
    }
    // `n` segments end at the n-th `/` (a rest follows) or at the end.
    if seen + 1 < n || (!shape.rest && end != v.len()) {
        return None;
    }
    Some(&v[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_count_is_the_slashes_plus_one() {
        let naive = |v: &[u8]| v.iter().filter(|&&b| b == b'/').count() + 1;
        let alphabet = [b'/', b'a', b'.', 0x2e, 0xaf, 0x2f ^ 0x80, 0, 0xff, b'0'];
        let mut rng = crate::core::test_rng::Rng(0x9e37_79b9_7f4a_7c15);
        for len in 0..40 {
            for _ in 0..200 {
                let v: Vec<u8> = (0..len).map(|_| rng.pick(&alphabet)).collect();
                assert_eq!(segment_count(&v), naive(&v), "{v:?}");
            }
            let all = vec![b'/'; len];
            assert_eq!(segment_count(&all), len + 1);
        }
        assert_eq!(segment_count(b"/bench"), 2);
        assert_eq!(segment_count(b"/users/7/orders"), 4);
    }

    #[test]
    fn first_segments_give_the_literal_key() {
        let values: &[&[u8]] = &[
            b"/",
            b"/a",
            b"/a/",
            b"/a/b",
            b"//",
            b"/a/b/c/d/e/f/g/h/i/j",
            b"/a*/b",
            b"/a/b\\c/d",
            b"/*",
            b"a",
            b"a/b",
            b"/a/b/c",
            b"/a/b/c/",
            b"/bench",
            b"/users/7/orders/9",
        ];
        for segments in 1..=11u8 {
            for rest in [false, true] {
                let shape = Shape {
                    segments,
                    wild: 0,
                    rest,
                };
                for &v in values {
                    let segs = v.iter().filter(|&&b| b == b'/').count() + 1;
                    let special = v.iter().any(|&b| b == b'*' || b == b'\\');
                    let n = usize::from(segments);
                    let fits = if rest { segs >= n } else { segs == n };
                    let ours = (fits && !special).then(|| first_segments(v, n, segs));
                    let theirs = literal_key(shape, v);
                    if !special {
                        assert_eq!(ours, theirs, "{shape:?} {v:?}");
                    } else {
                        assert!(ours.is_none());
                    }
                }
            }
        }
    }

    #[test]
    fn templates_match_whole_segments() {
        let t = b"/users/*/orders";
        assert!(template_matches(t, b"/users/7/orders"));
        assert!(!template_matches(t, b"/users/7/8/orders"));
        assert!(!template_matches(t, b"/users/7/orders/9"));
        assert!(!template_matches(t, b"/users//orders"));
        assert!(!template_matches(t, b"/users/7/order"));
        let r = b"/api/**";
        for v in [&b"/api"[..], b"/api/", b"/api/a/b"] {
            assert!(template_matches(r, v), "{:?}", v);
        }
        assert!(!template_matches(r, b"/apix"));
        assert!(!template_matches(r, b"/ap"));
        // A literal star, escaped; a request's own star is literal.
        assert!(template_matches(br"/a/\*", b"/a/*"));
        assert!(!template_matches(br"/a/\*", b"/a/b"));
        assert!(template_matches(b"/a/*", b"/a/*"));
    }

    #[test]
    fn bad_templates_are_refused() {
        assert_eq!(parse_template(b"***"), Err(TemplateError::Star));
        assert_eq!(parse_template(b"/a*"), Err(TemplateError::Star));
        assert_eq!(parse_template(b"/**/a"), Err(TemplateError::Rest));
        assert_eq!(parse_template(b"**"), Err(TemplateError::Rest));
        assert_eq!(parse_template(br"/a\b"), Err(TemplateError::Escape));
        assert_eq!(parse_template(br"/a\"), Err(TemplateError::Escape));
        let long = "/a".repeat(40);
        assert_eq!(
            parse_template(long.as_bytes()),
            Err(TemplateError::TooManySegments)
        );
        assert!(parse_template(b"/**").is_ok());
        assert!(parse_template(br"/\\/\*").is_ok());
    }

    #[test]
    fn keys_split_at_their_operator() {
        assert_eq!(Op::split_key("api^"), ("api", Op::Prefix));
        assert_eq!(Op::split_key("api~"), ("api", Op::Template));
        assert_eq!(Op::split_key("userid!"), ("userid", Op::Not));
        assert_eq!(Op::split_key("api"), ("api", Op::Exact));
        for op in [Op::Exact, Op::Prefix, Op::Template, Op::Not] {
            assert_eq!(Op::from_bits(op as u8), op);
        }
    }
}
