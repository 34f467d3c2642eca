//! Pure parsers for the module's directive arguments.
//!
//! No nginx types here: every function takes the argument bytes and returns a
//! value or a [`ParseError`] whose message names the directive and the value,
//! so `nginx -t` says exactly what is wrong. `conf.rs` reports the error once
//! through `ngx_conf_log_error` and returns `NGX_CONF_ERROR`.

pub use crate::core::headers::HeaderStyle;
use crate::core::model::valid_dimension_name;

/// Built-in dimensions, filled from the request without a directive.
pub const BUILTIN_DIMENSIONS: [&str; 4] = ["ip", "api", "method", "host"];

/// Default shared-memory file written by the agent.
pub const DEFAULT_SHM_PATH: &str = "/run/rate-ctl/rate_ctl";

/// Why a directive argument was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error(
        "invalid value \"{value}\" in \"{directive}\" directive, it must be \"on\" or \"off\""
    )]
    BadFlag {
        directive: &'static str,
        value: String,
    },
    #[error("invalid status \"{value}\" in \"{directive}\" directive, it must be a number between 400 and 599")]
    BadStatus {
        directive: &'static str,
        value: String,
    },
    #[error("invalid level \"{value}\" in \"rate_ctl_log_level\" directive, it must be \"info\", \"notice\", \"warn\" or \"error\"")]
    BadLogLevel { value: String },
    #[error("invalid value \"{value}\" in \"rate_ctl_headers\" directive, it must be \"off\", \"on\", \"legacy\" or \"draft\"")]
    BadHeaderStyle { value: String },
    #[error("invalid dimension name \"{value}\" in \"rate_ctl_dimension\" directive, it must match [a-z][a-z0-9_]* and be at most 32 bytes")]
    BadDimensionName { value: String },
    #[error("dimension \"{value}\" in \"rate_ctl_dimension\" directive is built in (ip, method, host) and cannot be redefined (api can)")]
    BuiltinDimension { value: String },
    #[error("duplicate dimension \"{value}\" in \"rate_ctl_dimension\" directive")]
    DuplicateDimension { value: String },
    #[error("invalid flag \"{value}\" for dimension \"{name}\" in \"rate_ctl_dimension\" directive, it must be \"path\", \"lowercase\", \"decode\" or \"last\"")]
    BadDimensionFlag { name: String, value: String },
    #[error("flag \"{value}\" for dimension \"{name}\" in \"rate_ctl_dimension\" directive is given twice")]
    DuplicateDimensionFlag { name: String, value: String },
    #[error("flag \"last\" for dimension \"{name}\" in \"rate_ctl_dimension\" directive needs the value to be one $arg_NAME variable")]
    LastNeedsArg { name: String },
    #[error("empty value for dimension \"{name}\" in \"rate_ctl_dimension\" directive")]
    EmptyDimensionValue { name: String },
    #[error("invalid path \"{value}\" in \"rate_ctl_shm\" directive, it must be an absolute file path without NUL bytes")]
    BadShmPath { value: String },
    #[error("unknown user \"{value}\" in \"rate_ctl_shm_owner\" directive")]
    UnknownUser { value: String },
    #[error("\"{directive}\" directive is duplicate")]
    Duplicate { directive: &'static str },
}

fn lossy(v: &[u8]) -> String {
    String::from_utf8_lossy(v).into_owned()
}

/// `on` / `off`, exactly as nginx's own flag slot accepts them (case-insensitive).
pub fn parse_flag(directive: &'static str, v: &[u8]) -> Result<bool, ParseError> {
    if v.eq_ignore_ascii_case(b"on") {
        Ok(true)
    } else if v.eq_ignore_ascii_case(b"off") {
        Ok(false)
    } else {
        Err(ParseError::BadFlag {
            directive,
            value: lossy(v),
        })
    }
}

/// An HTTP status for a refused request: 400..=599, plain decimal digits.
pub fn parse_status(directive: &'static str, v: &[u8]) -> Result<u16, ParseError> {
    let bad = || ParseError::BadStatus {
        directive,
        value: lossy(v),
    };
    if v.is_empty() || v.len() > 3 || !v.iter().all(u8::is_ascii_digit) {
        return Err(bad());
    }
    let n = v.iter().fold(0u16, |n, d| n * 10 + u16::from(d - b'0'));
    if (400..=599).contains(&n) {
        Ok(n)
    } else {
        Err(bad())
    }
}

/// Severity of the rejection log lines. Delays log one level lower.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    Info,
    Notice,
    Warn,
    Error,
}

impl LogLevel {
    /// nginx's `NGX_LOG_*` value (error = 4, warn = 5, notice = 6, info = 7).
    pub fn ngx_level(self) -> usize {
        match self {
            LogLevel::Error => 4,
            LogLevel::Warn => 5,
            LogLevel::Notice => 6,
            LogLevel::Info => 7,
        }
    }

    /// The level for delayed requests: one step less severe, like `limit_req`.
    pub fn lower(self) -> LogLevel {
        match self {
            LogLevel::Error => LogLevel::Warn,
            LogLevel::Warn => LogLevel::Notice,
            LogLevel::Notice | LogLevel::Info => LogLevel::Info,
        }
    }
}

pub fn parse_log_level(v: &[u8]) -> Result<LogLevel, ParseError> {
    match v {
        b"info" => Ok(LogLevel::Info),
        b"notice" => Ok(LogLevel::Notice),
        b"warn" => Ok(LogLevel::Warn),
        b"error" => Ok(LogLevel::Error),
        _ => Err(ParseError::BadLogLevel { value: lossy(v) }),
    }
}

/// `rate_ctl_headers off | on | legacy | draft` (see core::headers).
pub fn parse_header_style(v: &[u8]) -> Result<HeaderStyle, ParseError> {
    HeaderStyle::parse(v).ok_or_else(|| ParseError::BadHeaderStyle { value: lossy(v) })
}

/// The name of a `rate_ctl_dimension`: a valid dimension name that is not
/// built in and not yet defined in `existing`.
pub fn parse_dimension_name<'a>(
    v: &'a [u8],
    existing: impl IntoIterator<Item = &'a str>,
) -> Result<&'a str, ParseError> {
    let name = std::str::from_utf8(v)
        .ok()
        .filter(|n| valid_dimension_name(n))
        .ok_or_else(|| ParseError::BadDimensionName { value: lossy(v) })?;
    // `api` may be rebound (`rate_ctl_dimension api $uri;`: raw bytes).
    if BUILTIN_DIMENSIONS.contains(&name) && name != "api" {
        return Err(ParseError::BuiltinDimension {
            value: name.to_string(),
        });
    }
    if existing.into_iter().any(|e| e == name) {
        return Err(ParseError::DuplicateDimension {
            value: name.to_string(),
        });
    }
    Ok(name)
}

/// The flags after a `rate_ctl_dimension`'s value: its normalisation
/// (see [`Normalise`](crate::core::normalise::Normalise)) and whether the
/// last of repeated `$arg_NAME` items wins (`last`; nginx takes the
/// first). `is_arg`: the value is one `$arg_NAME` variable.
pub fn parse_dimension_flags<'a>(
    name: &str,
    flags: impl IntoIterator<Item = &'a [u8]>,
    is_arg: bool,
) -> Result<(crate::core::normalise::Normalise, bool), ParseError> {
    let mut n = crate::core::normalise::Normalise::NONE;
    let mut last = false;
    for f in flags {
        let slot = match f {
            b"path" => &mut n.path,
            b"lowercase" => &mut n.lowercase,
            b"decode" => &mut n.decode,
            b"last" if !is_arg => {
                return Err(ParseError::LastNeedsArg {
                    name: name.to_string(),
                })
            }
            b"last" => &mut last,
            _ => {
                return Err(ParseError::BadDimensionFlag {
                    name: name.to_string(),
                    value: lossy(f),
                })
            }
        };
        if std::mem::replace(slot, true) {
            return Err(ParseError::DuplicateDimensionFlag {
                name: name.to_string(),
                value: lossy(f),
            });
        }
    }
    Ok((n, last))
}

/// The value of the last item named `name` in `args` (the `last` flag of
/// a `$arg_NAME` dimension; PHP and Rails read the last duplicate): the
/// whole query string is walked. `name` is given in lower case.
pub fn query_arg_last<'a>(args: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    let mut found = None;
    let mut rest = args;
    loop {
        let mut seen = 0;
        let Some(v) = query_arg_seen(rest, name, &mut seen) else {
            return found;
        };
        found = Some(v);
        // Continue after this item's value.
        let end = v.as_ptr() as usize + v.len() - rest.as_ptr() as usize;
        if end >= rest.len() {
            return found;
        }
        rest = &rest[end + 1..];
    }
}

/// The value template of a `rate_ctl_dimension` must not be empty (an empty
/// template would make the dimension absent on every request).
pub fn check_dimension_value(name: &str, v: &[u8]) -> Result<(), ParseError> {
    if v.is_empty() {
        Err(ParseError::EmptyDimensionValue {
            name: name.to_string(),
        })
    } else {
        Ok(())
    }
}

/// The variable name when a `rate_ctl_dimension` value is exactly one
/// variable (`$arg_user`, `${http_x_user}`): such a dimension is read by
/// the variable's index, without evaluating a template. Regex captures
/// (`$1`) and anything with text around the variable are templates.
pub fn single_variable(v: &[u8]) -> Option<&[u8]> {
    let rest = v.strip_prefix(b"$")?;
    let name = match rest.strip_prefix(b"{") {
        Some(braced) => braced.strip_suffix(b"}")?,
        None => rest,
    };
    let word = |c: &u8| c.is_ascii_alphanumeric() || *c == b'_';
    let first = *name.first()?;
    (!first.is_ascii_digit() && name.iter().all(word)).then_some(name)
}

/// The value of query argument `name` in `args` (`a=1&b=2`), as nginx's
/// `$arg_NAME` finds it (`ngx_http_arg`): the first `&`-separated item
/// whose name equals `name` ignoring ASCII case, up to the next `&`.
/// `name` is given in lower case. A scalar scan: query strings are short.
/// (The module reads through [`query_arg_seen`]; this is its reference.)
#[cfg(test)]
pub fn query_arg<'a>(args: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    query_arg_seen(args, name, &mut 0)
}

/// The bit of [`query_arg_seen`]'s mask for an item (or name) starting
/// with byte `b`, ignoring ASCII case.
#[inline]
pub fn first_byte_bit(b: u8) -> u64 {
    1 << (b.to_ascii_lowercase() & 63)
}

/// [`query_arg`]; when `name` is absent (every item was walked), `seen`
/// becomes the mask of the items' first bytes ([`first_byte_bit`]; never 0
/// for a query that is not empty). A later name whose first byte's bit is
/// not in it is absent without a scan. (Always inlined: the request
/// path's `$arg` reader is a leaf around it.)
#[inline(always)]
pub fn query_arg_seen<'a>(args: &'a [u8], name: &[u8], seen: &mut u64) -> Option<&'a [u8]> {
    let from = query_arg_from(args, name, seen)?;
    let mut to = from;
    while to < args.len() && args[to] != b'&' {
        to += 1;
    }
    args.get(from..to)
}

/// Where [`query_arg_seen`]'s value starts in `args` (just after the
/// item's `=`: at most `args.len()`), `seen` as it sets it; the value runs
/// to the next `&`. For a caller that compares the value in place
/// ([`query_value_differs`]) rather than finding its end.
#[inline(always)]
pub fn query_arg_from(args: &[u8], name: &[u8], seen: &mut u64) -> Option<usize> {
    let n = name.len();
    let len = args.len();
    if n == 0 {
        return None;
    }
    let mut bits = 0;
    let mut i = 0; // the start of an item
    while i < len {
        if i + n < len && args[i + n] == b'=' {
            let mut k = 0;
            // The usual item is spelled as the name: no case folded.
            while k < n && (args[i + k] == name[k] || args[i + k].to_ascii_lowercase() == name[k]) {
                k += 1;
            }
            if k == n {
                return Some(i + n + 1);
            }
        }
        // Not this item: its first byte noted (only an absent name
        // leaves `seen`).
        bits |= first_byte_bit(args[i]);
        while i < len && args[i] != b'&' {
            i += 1;
        }
        i += 1;
    }
    *seen = bits;
    None
}

/// Whether the value starting at `args[from]` (up to the next `&`, see
/// [`query_arg_from`]) differs from `not`, an empty value differing from
/// every value (it is absent): compared in place, without finding the
/// value's end first. The value is `not` when `not`'s bytes are there,
/// followed by the end or a `&`, and `not` holds no `&` (a value never
/// does); the last two are looked at only when the bytes are the same.
#[inline(always)]
pub fn query_value_differs(args: &[u8], from: usize, not: &[u8]) -> bool {
    let m = not.len();
    let Some(rest) = args.get(from..) else {
        return true;
    };
    match rest.get(..m) {
        Some(v) if crate::core::value_map::bytes_eq_inline(v, not) => {
            not.is_empty() || rest.get(m).is_some_and(|&b| b != b'&') || not.contains(&b'&')
        }
        _ => true,
    }
}

/// `rate_ctl_shm_owner USER`: a user name or uid.
pub fn parse_shm_owner(v: &[u8]) -> Result<u32, ParseError> {
    std::str::from_utf8(v)
        .ok()
        .filter(|s| !s.is_empty())
        .and_then(crate::core::shm::uid_of)
        .ok_or_else(|| ParseError::UnknownUser { value: lossy(v) })
}

/// `rate_ctl_shm PATH`: an absolute path.
pub fn parse_shm_path(v: &[u8]) -> Result<String, ParseError> {
    let bad = || ParseError::BadShmPath { value: lossy(v) };
    let s = std::str::from_utf8(v).map_err(|_| bad())?;
    if !s.starts_with('/') || s.ends_with('/') || s.contains('\0') {
        return Err(bad());
    }
    Ok(s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_args_as_nginx_finds_them() {
        let q = |args: &str, name: &str| {
            query_arg(args.as_bytes(), name.to_ascii_lowercase().as_bytes())
                .map(|v| String::from_utf8_lossy(v).into_owned())
        };
        assert_eq!(q("a=a5&b=b5", "a").as_deref(), Some("a5"));
        assert_eq!(q("a=a5&b=b5", "b").as_deref(), Some("b5"));
        assert_eq!(q("a=a5&b=b5", "c"), None);
        assert_eq!(q("xa=1&a=2", "a").as_deref(), Some("2"));
        assert_eq!(q("A=1&a=2", "a").as_deref(), Some("1")); // first, any case
        assert_eq!(q("user=u1", "USER").as_deref(), Some("u1"));
        assert_eq!(q("a=&b=1", "a").as_deref(), Some(""));
        assert_eq!(q("a&a=3", "a").as_deref(), Some("3"));
        assert_eq!(q("ab=1", "a"), None);
        assert_eq!(q("a=1=2&b", "a").as_deref(), Some("1=2"));
        assert_eq!(q("&&a=1&", "a").as_deref(), Some("1"));
        assert_eq!(q("", "a"), None);
        assert_eq!(q("a=1", ""), None);
        assert_eq!(q("b=1&a=", "a").as_deref(), Some(""));
        assert_eq!(q("a", "a"), None);
    }

    /// nginx's `ngx_http_arg` as it is written: a case-insensitive
    /// substring search for the name (not in the last byte), accepted at
    /// the start or after a `&` and followed by `=`, the value up to the
    /// next `&`.
    fn ngx_http_arg<'a>(args: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
        let (len, n) = (args.len(), name.len());
        if len == 0 || n == 0 {
            return None;
        }
        let mut p = 0;
        while p + n < len {
            let at = (p..len - n).find(|&s| args[s..s + n].eq_ignore_ascii_case(name))?;
            if (at == 0 || args[at - 1] == b'&') && args[at + n] == b'=' {
                let from = at + n + 1;
                let to = args[from..]
                    .iter()
                    .position(|&b| b == b'&')
                    .map_or(len, |k| from + k);
                return Some(&args[from..to]);
            }
            p = at + 1;
        }
        None
    }

    #[test]
    fn query_args_as_ngx_http_arg_on_random_query_strings() {
        let alphabet = b"aAbB=&&x%";
        let names: [&[u8]; 5] = [b"a", b"ab", b"b", b"aa", b"ba"];
        let mut rng = crate::core::test_rng::Rng(0x2545_f491_4f6c_dd1d);
        for len in 0..40 {
            for _ in 0..300 {
                let args: Vec<u8> = (0..len).map(|_| rng.pick(alphabet)).collect();
                for name in names {
                    let mut seen = 0;
                    assert_eq!(
                        query_arg_seen(&args, name, &mut seen),
                        ngx_http_arg(&args, name),
                        "{:?} {:?}",
                        String::from_utf8_lossy(&args),
                        String::from_utf8_lossy(name)
                    );
                }
            }
        }
    }

    /// A negated plain `$arg` is compared in place (issue 30, session 18):
    /// where its value starts, then `not`'s bytes there, never the value's
    /// end. On random query strings that is the value read whole and
    /// compared, an absent or empty value differing from every value, and
    /// leaves `seen` as the whole read does.
    #[test]
    fn a_negated_arg_compared_in_place_is_the_value_read_then_compared() {
        let alphabet = b"aAbB=&&x%";
        let names: [&[u8]; 5] = [b"a", b"ab", b"b", b"aa", b"ba"];
        let nots: [&[u8]; 9] = [b"x", b"a", b"ab", b"x%", b"xx", b"B", b"&", b"x&", b"a=b"];
        let mut rng = crate::core::test_rng::Rng(0x9e37_79b9_7f4a_7c15);
        let mut equal = 0;
        for len in 0..24 {
            for _ in 0..300 {
                let args: Vec<u8> = (0..len).map(|_| rng.pick(alphabet)).collect();
                for name in names {
                    for not in nots {
                        let (mut s1, mut s2) = (0, 0);
                        let read = match query_arg_seen(&args, name, &mut s1) {
                            Some(v) if !v.is_empty() => v != not,
                            _ => true,
                        };
                        let in_place = query_arg_from(&args, name, &mut s2)
                            .is_none_or(|from| query_value_differs(&args, from, not));
                        assert_eq!(
                            (in_place, s2),
                            (read, s1),
                            "{:?} {:?} != {:?}",
                            String::from_utf8_lossy(&args),
                            String::from_utf8_lossy(name),
                            String::from_utf8_lossy(not)
                        );
                        equal += usize::from(!read);
                    }
                }
            }
        }
        // Not a test of absent values only: many cases hold the value.
        assert!(
            equal > 100,
            "{equal} cases where the value is the negated one"
        );
    }

    #[test]
    fn a_miss_says_which_first_bytes_the_items_have() {
        let names: [&[u8]; 6] = [b"a", b"b", b"user", b"c", b"ab", b"u"];
        for args in [
            "a=a5&b=b5",
            "A=1&a=2&B=&user=u",
            "a&a=3&b",
            "&&a=1&",
            "USER=x&ab=y&User=z",
            "=1&a&=&b=2",
            "x",
        ] {
            let a = args.as_bytes();
            for miss in names {
                let mut seen = 0;
                if query_arg_seen(a, miss, &mut seen).is_some() {
                    assert_eq!(seen, 0, "{args:?}: a hit leaves the mask");
                    continue;
                }
                assert_ne!(seen, 0, "{args:?}");
                // A name the mask rules out is absent indeed.
                for other in names {
                    if seen & first_byte_bit(other[0]) == 0 {
                        assert_eq!(query_arg(a, other), None, "{args:?} {other:?}");
                    }
                }
            }
        }
        let mut seen = 0;
        assert_eq!(query_arg_seen(b"a=a5&b=b5", b"c", &mut seen), None);
        assert_eq!(seen, first_byte_bit(b'a') | first_byte_bit(b'b'));
    }

    #[test]
    fn single_variable_bindings() {
        assert_eq!(single_variable(b"$arg_a"), Some(&b"arg_a"[..]));
        assert_eq!(
            single_variable(b"${http_x_user}"),
            Some(&b"http_x_user"[..])
        );
        assert_eq!(single_variable(b"$Host_2"), Some(&b"Host_2"[..]));
        for template in [
            &b"$arg_a$arg_b"[..],
            b"u-$arg_a",
            b"$arg_a-x",
            b"${arg_a}x",
            b"${arg_a",
            b"$1",
            b"$",
            b"${}",
            b"arg_a",
            b"$arg-a",
        ] {
            assert_eq!(
                single_variable(template),
                None,
                "{:?}",
                String::from_utf8_lossy(template)
            );
        }
    }

    #[test]
    fn flags() {
        assert_eq!(parse_flag("rate_ctl", b"on"), Ok(true));
        assert_eq!(parse_flag("rate_ctl", b"OFF"), Ok(false));
        let e = parse_flag("rate_ctl", b"yes").unwrap_err().to_string();
        assert!(e.contains("\"yes\"") && e.contains("\"rate_ctl\""), "{e}");
        assert!(parse_flag("rate_ctl", b"").is_err());
    }

    #[test]
    fn statuses() {
        assert_eq!(parse_status("rate_ctl_status", b"429"), Ok(429));
        assert_eq!(parse_status("rate_ctl_status", b"400"), Ok(400));
        assert_eq!(parse_status("rate_ctl_status", b"599"), Ok(599));
        for bad in [&b"399"[..], b"600", b"", b"4290", b"-429", b"42a", b"+429"] {
            let e = parse_status("rate_ctl_status", bad)
                .unwrap_err()
                .to_string();
            assert!(e.contains("rate_ctl_status"), "{e}");
        }
    }

    #[test]
    fn log_levels() {
        assert_eq!(parse_log_level(b"warn"), Ok(LogLevel::Warn));
        assert_eq!(LogLevel::Error.lower(), LogLevel::Warn);
        assert_eq!(LogLevel::Info.lower(), LogLevel::Info);
        assert_eq!(LogLevel::Notice.ngx_level(), 6);
        assert!(parse_log_level(b"debug").is_err());
        assert!(parse_log_level(b"WARN").is_err());
    }

    #[test]
    fn dimension_flags() {
        use crate::core::normalise::Normalise;
        let f =
            |v: &[&str], arg| parse_dimension_flags("userid", v.iter().map(|s| s.as_bytes()), arg);
        assert_eq!(f(&[], true), Ok((Normalise::NONE, false)));
        assert_eq!(
            f(&["decode", "lowercase", "last"], true),
            Ok((
                Normalise {
                    decode: true,
                    lowercase: true,
                    path: false
                },
                true
            ))
        );
        assert_eq!(f(&["path"], false), Ok((Normalise::PATH, false)));
        assert!(matches!(
            f(&["last"], false),
            Err(ParseError::LastNeedsArg { .. })
        ));
        assert!(matches!(
            f(&["Path"], true),
            Err(ParseError::BadDimensionFlag { .. })
        ));
        assert!(matches!(
            f(&["path", "path"], true),
            Err(ParseError::DuplicateDimensionFlag { .. })
        ));
        assert_eq!(query_arg_last(b"u=a&u=b&x=1", b"u"), Some(&b"b"[..]));
        assert_eq!(query_arg_last(b"u=a&x=1", b"u"), Some(&b"a"[..]));
        assert_eq!(query_arg_last(b"x=1&u=", b"u"), Some(&b""[..]));
        assert_eq!(query_arg_last(b"x=1", b"u"), None);
        assert_eq!(parse_dimension_name(b"api", []), Ok("api"));
    }

    #[test]
    fn dimension_names() {
        assert_eq!(parse_dimension_name(b"userid", []), Ok("userid"));
        assert_eq!(
            parse_dimension_name(b"userid", ["appid", "userid"]),
            Err(ParseError::DuplicateDimension {
                value: "userid".into()
            })
        );
        assert_eq!(
            parse_dimension_name(b"ip", []),
            Err(ParseError::BuiltinDimension { value: "ip".into() })
        );
        for bad in [&b"User"[..], b"1x", b"", b"a-b", &[b'a'; 33]] {
            assert!(matches!(
                parse_dimension_name(bad, []),
                Err(ParseError::BadDimensionName { .. })
            ));
        }
        assert!(check_dimension_value("userid", b"").is_err());
        assert!(check_dimension_value("userid", b"$cookie_uid").is_ok());
    }

    #[test]
    fn shm_paths() {
        assert_eq!(parse_shm_path(b"/dev/shm/x"), Ok("/dev/shm/x".into()));
        for bad in [&b"rel/path"[..], b"", b"/dev/shm/", b"/a\0b"] {
            assert!(parse_shm_path(bad).is_err());
        }
    }
}
