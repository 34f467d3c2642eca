//! Request- and file-derived bytes on their way to a log line (or the
//! `$rate_ctl_key` text): one helper, so that no client can write control
//! characters (terminal escapes, newlines that forge a log line) or
//! invalid UTF-8 into error.log, nor a line of unbounded length.

use std::fmt::Write;

/// Longest escaped text kept of one value (bytes of output).
pub const LOG_VALUE_MAX: usize = 256;

/// `bytes` as text: printable UTF-8 kept as it is, `\` as `\\`, control
/// characters (C0, DEL, C1) and bytes that are not UTF-8 as `\xNN`. At
/// most `max` bytes of output; longer input ends with `...` and how many
/// input bytes there were.
pub fn escape_bytes(bytes: &[u8], max: usize) -> String {
    let mut out = String::with_capacity(bytes.len().min(max) + 8);
    push_escaped(&mut out, bytes, max);
    out
}

/// [`escape_bytes`] appended to `out` (at most `max` bytes added).
pub fn push_escaped(out: &mut String, bytes: &[u8], max: usize) {
    let start = out.len();
    let mut rest = bytes;
    while !rest.is_empty() {
        let (valid, bad) = match std::str::from_utf8(rest) {
            Ok(s) => (s, &[][..]),
            Err(e) => {
                let (v, b) = rest.split_at(e.valid_up_to());
                // `v` is valid UTF-8: it ends where the error starts.
                (std::str::from_utf8(v).unwrap_or(""), b)
            }
        };
        for c in valid.chars() {
            let before = out.len();
            match c {
                '\\' => out.push_str("\\\\"),
                c if c.is_control() => {
                    let mut buf = [0u8; 4];
                    for b in c.encode_utf8(&mut buf).bytes() {
                        let _ = write!(out, "\\x{b:02x}");
                    }
                }
                c => out.push(c),
            }
            if out.len() - start > max {
                out.truncate(before);
                return truncated(out, bytes.len());
            }
        }
        rest = match bad.split_first() {
            Some((&b, tail)) => {
                let _ = write!(out, "\\x{b:02x}");
                if out.len() - start > max {
                    out.truncate(out.len() - 4);
                    return truncated(out, bytes.len());
                }
                tail
            }
            None => &[],
        };
    }
}

fn truncated(out: &mut String, len: usize) {
    let _ = write!(out, "...({len} bytes)");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_and_invalid_bytes_are_escaped() {
        assert_eq!(escape_bytes(b"u1", 64), "u1");
        assert_eq!(escape_bytes(b"a\x1b[31mb", 64), "a\\x1b[31mb");
        assert_eq!(escape_bytes(b"x\ny\r\0", 64), "x\\x0ay\\x0d\\x00");
        assert_eq!(escape_bytes(b"\xff\xfeok", 64), "\\xff\\xfeok");
        assert_eq!(escape_bytes("caf\u{e9}".as_bytes(), 64), "caf\u{e9}");
        assert_eq!(escape_bytes("\u{85}".as_bytes(), 64), "\\xc2\\x85");
        assert_eq!(escape_bytes(b"a\\x1b", 64), "a\\\\x1b");
        assert_eq!(escape_bytes(b"\x7f", 64), "\\x7f");
    }

    #[test]
    fn long_values_are_capped() {
        let long = vec![b'a'; 10_000];
        let s = escape_bytes(&long, 256);
        assert_eq!(s, format!("{}...(10000 bytes)", "a".repeat(256)));
        let esc = vec![0x1bu8; 1000];
        let s = escape_bytes(&esc, 256);
        assert!(s.len() <= 256 + 20, "{}", s.len());
        assert!(
            s.starts_with("\\x1b\\x1b") && s.ends_with("...(1000 bytes)"),
            "{s}"
        );
        assert!(!s.bytes().any(|b| b < 0x20), "{s}");
    }
}
