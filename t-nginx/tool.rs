//! Test tool for the t-nginx suites: writes the shared-memory table with the
//! core `Writer`, the same code path as the agent.
//!
//! ```text
//! rate-ctl-test-tool publish PATH TABLE_FILE [CONFIG_VERSION]
//! rate-ctl-test-tool corrupt PATH      # publish a segment with a bad checksum
//! rate-ctl-test-tool craft PATH KIND   # a checksum-valid hostile segment (count, record-length, blacklist-dimensions)
//! rate-ctl-test-tool heartbeat PATH
//! rate-ctl-test-tool fill-keys PATH N [dim=value ...]  # N requests from 10.0.0.0 + i
//! ```
//!
//! TABLE_FILE, one item per line (`#` starts a comment):
//! ```text
//! strategy id=1 algorithm=token_bucket rate=5 per=second burst=5 action=reject status=429 when ip=127.0.0.1 api=/pay
//! strategy id=2 algorithm=leaky_bucket rate=10 per=second action=delay max_delay_ms=500
//! strategy id=3 algorithm=concurrency rate=2 action=dry_run when api=/slow
//! strategy id=4 algorithm=warm_up rate=100 warm_up_ms=2000 cold_factor=3 when api=/cold
//! strategy id=5 rate=1 action=allow priority=10 when ip=10.0.0.0/8
//! strategy id=5 rate=5 per=minute burst=5 each=ip ipv6_prefix=64 on_full=reject when api=/login
//! strategy id=6 rate=2 per=hour burst=2 each=userid,api   # per (userid, api) pair
//! blacklist ip 127.0.0.1 ttl_ms=1500
//! blacklist userid u666
//! ```

use std::path::Path;
use std::process::ExitCode;

use rate_ctl::core::blacklist::BlacklistEntry;
use rate_ctl::core::clock::unix_ms;
use rate_ctl::core::model::{Action, Condition, Strategy};
use rate_ctl::core::shm::writer::Writer;
use rate_ctl::core::shm::{Capacities, Mapping, H_SEQ};

/// The file's capacities: 16,384 strategies in 4 MiB segments, or what
/// `RATE_CTL_TOOL_MAX_STRATEGIES` and `RATE_CTL_TOOL_SEGMENT_MB` say (the
/// instruction benchmark's large tables).
fn caps() -> Capacities {
    let env = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    Capacities {
        max_strategies: env("RATE_CTL_TOOL_MAX_STRATEGIES", 16_384) as u32,
        segment_bytes: (env("RATE_CTL_TOOL_SEGMENT_MB", 4) as u64) << 20,
        blacklist_entries: 1024,
        keys: env("RATE_CTL_TOOL_KEYS", 65_536) as u32,
    }
}

fn parse_strategy(words: &[&str]) -> Result<Strategy, String> {
    let mut s = Strategy::plain(
        0,
        Vec::new(),
        "token_bucket".parse().map_err(|e| format!("{e}"))?,
        0,
        "second".parse().map_err(|e| format!("{e}"))?,
    );
    if words.contains(&"algorithm=warm_up") {
        s.warm_up.cold_factor = rate_ctl::core::model::DEFAULT_COLD_FACTOR;
    }
    let mut action = "reject";
    let mut status = None;
    let mut max_delay_ms = 0;
    let mut when = false;
    for w in words {
        if *w == "when" {
            when = true;
            continue;
        }
        let (k, v) = w
            .split_once('=')
            .ok_or_else(|| format!("expected key=value, got {w:?}"))?;
        if when {
            // `api^=/x`, `api~=/t/*`, `u!=x`: the key carries the operator.
            s.conditions.push(Condition::from_key(k, v.as_bytes()));
            continue;
        }
        let num = || v.parse::<u64>().map_err(|e| format!("{k}: {e}"));
        match k {
            "id" => s.id = num()? as u32,
            "name" => s.name = v.to_string(),
            "algorithm" => s.algorithm = v.parse().map_err(|e| format!("{e}"))?,
            "rate" => s.rate = num()?,
            "per" => s.per = v.parse().map_err(|e| format!("{e}"))?,
            "burst" => s.burst = num()? as u32,
            "action" => action = v,
            "status" => status = Some(num()? as u16),
            "max_delay_ms" => max_delay_ms = num()? as u32,
            "enabled" => s.enabled = v == "true",
            "priority" => s.priority = v.parse().map_err(|e| format!("{k}: {e}"))?,
            "warm_up_ms" => s.warm_up.period_ms = num()? as u32,
            "each" => s.each.dims = v.split(',').map(str::to_string).collect(),
            "ipv4_prefix" => s.each.ipv4_prefix = num()? as u8,
            "ipv6_prefix" => s.each.ipv6_prefix = num()? as u8,
            "on_full" => s.each.on_full = v.parse().map_err(|e| format!("{e}"))?,
            "count_if" => {
                s.response.count_if = rate_ctl::core::model::response::StatusSet::parse(v)
                    .map_err(|e| format!("{e}"))?
            }
            "cost_from" => s.response.cost_from = v.to_string(),
            "cost_after" => s.response.cost_after = v.to_string(),
            "tz" => s.tz = v.to_string(),
            "max_keys" => s.each.max_keys = num()?.try_into().map_err(|e| format!("{k}: {e}"))?,
            "cold_factor" => {
                s.warm_up.cold_factor = num()?.try_into().map_err(|e| format!("{k}: {e}"))?
            }
            _ => return Err(format!("unknown key {k:?}")),
        }
    }
    s.action = match action {
        "reject" => Action::Reject { status },
        "delay" => Action::Delay { max_delay_ms },
        "dry_run" if max_delay_ms > 0 => Action::DryRunDelay { max_delay_ms },
        "dry_run" => Action::DryRun,
        "allow" => Action::Allow,
        other => return Err(format!("unknown action {other:?}")),
    };
    Ok(s)
}

fn parse_table(text: &str) -> Result<(Vec<Strategy>, Vec<BlacklistEntry>), String> {
    let mut strategies = Vec::new();
    let mut blacklist = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        let words: Vec<&str> = line.split_whitespace().collect();
        let err = |e: String| format!("line {}: {e}", n + 1);
        match words.first() {
            None => {}
            Some(&"strategy") => strategies.push(parse_strategy(&words[1..]).map_err(err)?),
            Some(&"blacklist") => {
                let (dim, value) = match words.get(1..3) {
                    Some([d, v]) => (*d, *v),
                    _ => return Err(err("blacklist DIMENSION VALUE [ttl_ms=N]".into())),
                };
                let expires_unix_ms = match words.get(3) {
                    Some(t) => {
                        let ms: u64 = t
                            .strip_prefix("ttl_ms=")
                            .and_then(|v| v.parse().ok())
                            .ok_or_else(|| err(format!("bad {t:?}")))?;
                        Some(unix_ms() + ms)
                    }
                    None => None,
                };
                blacklist.push(BlacklistEntry {
                    dimension: dim.to_string(),
                    value: value.as_bytes().to_vec(),
                    expires_unix_ms,
                });
            }
            Some(other) => return Err(err(format!("unknown item {other:?}"))),
        }
    }
    Ok((strategies, blacklist))
}

fn run(args: &[String]) -> Result<(), String> {
    match args {
        [cmd, path, file, rest @ ..] if cmd == "publish" => {
            let text = std::fs::read_to_string(file).map_err(|e| format!("{file}: {e}"))?;
            let (strategies, blacklist) = parse_table(&text)?;
            let version = rest.first().map_or(Ok(1), |v| v.parse::<u64>()).map_err(|e| e.to_string())?;
            let mut w = Writer::create_or_adopt(Path::new(path), caps(), 0o666).map_err(|e| e.to_string())?;
            let report = w.publish(&strategies, &blacklist, version).map_err(|e| e.to_string())?;
            w.heartbeat(unix_ms());
            println!("published seq {} with {} strategies", report.seq, report.strategies);
            Ok(())
        }
        [cmd, path] if cmd == "corrupt" => {
            // Announce a new sequence whose segment fails its checksum: the
            // workers must refuse it and keep their last good table.
            let m = Mapping::open_writable(Path::new(path)).map_err(|e| e.to_string())?;
            let next = m.seq() + 1;
            let seg = m.segment((next & 1) as usize);
            // Overwrite the payload's first word (covered by the CRC) and
            // stamp the segment with the new publish sequence.
            seg.store(64, 0xdead_beef_dead_beef);
            seg.store(16, next);
            m.header().store(H_SEQ, next);
            println!("announced corrupt seq {next}");
            Ok(())
        }
        [cmd, path, kind] if cmd == "craft" => {
            // A checksum-valid hostile segment (count, record-length,
            // blacklist-dimensions: see core::fuzz::Crafted), announced as
            // the next sequence: the workers must refuse it, keep their
            // last good table and stay up.
            let c = rate_ctl::core::fuzz::Crafted::from_name(kind).ok_or_else(|| format!("unknown crafted segment {kind:?}"))?;
            // The agent's side: a worker's mapping of the configuration is read-only.
            let m = Mapping::open_writable(Path::new(path)).map_err(|e| e.to_string())?;
            let seq = c.publish(&m);
            println!("announced crafted ({kind}) seq {seq}");
            Ok(())
        }
        [cmd, path, n, pairs @ ..] if cmd == "fill-keys" => {
            // N requests from N client addresses with the given values,
            // through the table as a worker decides: one key each for the
            // per-key strategies they match (the instruction benchmark's
            // occupied key table).
            let n: u32 = n.parse().map_err(|e| format!("N: {e}"))?;
            let mut e = rate_ctl::core::shm::reader::Reader::new(Path::new(path));
            e.refresh(rate_ctl::core::clock::MonotonicClock::now());
            let t = e.table().ok_or("no table in the file")?.clone();
            let pairs: Vec<(&str, &[u8])> = pairs
                .iter()
                .filter_map(|p| p.split_once('='))
                .map(|(d, v)| (d, v.as_bytes()))
                .collect();
            let values = t.values_of(&pairs);
            // The benchmark's own client first, so that it has an entry
            // whatever the filler leaves free.
            let own = std::iter::once(std::net::IpAddr::from([127, 0, 0, 1]));
            let filler = (0..n).map(|i| std::net::IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i)));
            for ip in own.chain(filler) {
                t.decide(&rate_ctl::core::table::Request {
                    values: &values[..],
                    ip: Some(ip.into()),
                    now_ns: rate_ctl::core::clock::MonotonicClock::now(),
                    now_unix_ms: unix_ms(),
                    dry_run: false,
                    quota: false,
                });
            }
            let s = t.mapping().ok_or("no mapping")?.keys().stats();
            println!(
                "key table: {} of {} entries occupied, longest probe {}",
                s.occupied, s.capacity, s.max_probe
            );
            Ok(())
        }
        [cmd, path] if cmd == "heartbeat" => {
            let w = Writer::create_or_adopt(Path::new(path), caps(), 0o666).map_err(|e| e.to_string())?;
            w.heartbeat(unix_ms());
            Ok(())
        }
        _ => Err("usage: rate-ctl-test-tool publish PATH TABLE [VERSION] | corrupt PATH | craft PATH KIND | heartbeat PATH".into()),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rate-ctl-test-tool: {e}");
            ExitCode::FAILURE
        }
    }
}
