//! The blacklist over arbitrary region bytes: `open` must refuse them or
//! answer lookups and rebuilds sanely, never panic or read out of bounds.
//!
//! First byte: mode. Even: the rest is the region as it is. Odd: a valid
//! table (capacity from the next byte) with a few entries, then the rest is
//! read as (word index u16, op u8, value u64) patches (set, xor, or set
//! one 32-bit half), reaching the geometry
//! checks and the slot reader far more often than random bytes would.
#![no_main]

use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicU64, Ordering};

use libfuzzer_sys::fuzz_target;
use rate_ctl::core::blacklist::{init, region_bytes, Blacklist, BlacklistEntry};
use rate_ctl::core::shm::region::Region;

fn entries(seed: u8) -> Vec<BlacklistEntry> {
    (0..(seed % 24) as u32)
        .map(|i| {
            if i % 2 == 0 {
                BlacklistEntry::new("userid", format!("u{i}"), None)
            } else {
                BlacklistEntry::new("ip", format!("10.0.{seed}.{i}"), Some(u64::from(i) * 1000))
            }
        })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let words: Vec<AtomicU64>;
    let mut probes: &[u8] = rest;
    if mode % 2 == 0 {
        words = Region::words_from_bytes(rest);
    } else {
        let Some((&cap, patches)) = rest.split_first() else {
            return;
        };
        let cap = u32::from(cap % 64);
        words = (0..region_bytes(cap) / 8)
            .map(|_| AtomicU64::new(0))
            .collect();
        let region = Region::from_atomics(&words);
        if init(region, cap).is_err() {
            return;
        }
        if let Ok(bl) = Blacklist::open(region) {
            let _ = bl.rebuild(&entries(mode));
        }
        for p in patches.chunks_exact(11) {
            let at = usize::from(u16::from_le_bytes([p[0], p[1]])) % words.len();
            let v = u64::from_le_bytes(p[3..11].try_into().unwrap_or([0; 8]));
            match p[2] % 3 {
                0 => words[at].store(v, Ordering::Relaxed),
                1 => {
                    words[at].fetch_xor(v, Ordering::Relaxed);
                }
                _ => {
                    // Replace one 32-bit half (header fields are u32).
                    let old = words[at].load(Ordering::Relaxed);
                    let new = if v & 1 == 0 {
                        (old & !0xffff_ffff) | (v >> 32)
                    } else {
                        (old & 0xffff_ffff) | (v & !0xffff_ffff)
                    };
                    words[at].store(new, Ordering::Relaxed);
                }
            }
        }
        probes = patches;
    }
    let region = Region::from_atomics(&words);
    let Ok(bl) = Blacklist::open(region) else {
        return;
    };
    let _ = bl.len();
    let _ = bl.dimensions_in_use().contains("userid");
    for (i, c) in probes.chunks(16).take(8).enumerate() {
        let mut b = [0u8; 16];
        b[..c.len()].copy_from_slice(c);
        let now = u64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8]));
        let _ = bl.contains_ip(IpAddr::from(Ipv6Addr::from(b)), now);
        let _ = bl.contains("userid", c, now);
        let _ = bl.contains("ip", c, now);
        let _ = bl.contains("ip", format!("10.0.{}.{i}", c[0]).as_bytes(), now);
    }
    let list = entries(mode.wrapping_add(1));
    if bl.rebuild(&list).is_ok() {
        // After a successful rebuild every entry of the new list is found.
        for e in &list {
            let now = 0;
            assert!(bl.contains(&e.dimension, &e.value, now), "{e:?} lost");
        }
    }
});
