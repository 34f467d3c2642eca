//! `rate-ctl shm inspect`: the header, the active table and the slot
//! counters of a shared-memory file.

use std::path::Path;

use serde_json::json;

use super::Failure;
use crate::agent::publish::read_active;
use rate_ctl::core::blacklist::Blacklist;
use rate_ctl::core::clock::unix_ms;
use rate_ctl::core::model::Action;
use rate_ctl::core::shm::slot::Slot;
use rate_ctl::core::shm::{Mapping, H_CONFIG_VERSION, H_CREATED, H_WRITER_PID, LAYOUT_VERSION};

/// println! that ignores a closed stdout (e.g. `| head`).
macro_rules! outln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($t)*);
    }};
}

/// `rate-ctl shm inspect`.
pub fn inspect(path: &Path, as_json: bool) -> Result<(), Failure> {
    let map = Mapping::open(path).map_err(|e| Failure::other(e.to_string()))?;
    let g = map.geometry;
    let header = map.header();
    let seq = map.seq();
    let heartbeat = map.heartbeat_unix_ms();
    let now = unix_ms();
    let heartbeat_age_ms = (heartbeat > 0).then(|| now.saturating_sub(heartbeat));
    let decoded = read_active(&map).map_err(|e| Failure::other(e.to_string()))?;
    let slots = map.slots();
    let keys = map.keys();
    let mut rows = Vec::new();
    if let Some(d) = &decoded {
        for p in &d.strategies {
            let s = &p.strategy;
            let (counters, current, undefined) = match Slot::at(&slots, p.slot) {
                Some(slot) => (
                    slot.counters(),
                    slot.generation().load(std::sync::atomic::Ordering::Relaxed) == p.generation,
                    slot.undefined_dimension(),
                ),
                None => (Default::default(), false, false),
            };
            let action = match s.action {
                Action::Reject { status } => json!({"reject": status}),
                Action::Delay { max_delay_ms } => json!({"delay_max_ms": max_delay_ms}),
                Action::DryRun => json!("dry_run"),
                Action::DryRunDelay { max_delay_ms } => {
                    json!({"dry_run_delay_max_ms": max_delay_ms})
                }
                Action::Allow => json!("allow"),
            };
            rows.push(json!({
                "id": s.id,
                "name": s.name,
                "match": s.conditions.iter().map(|c| {
                    (c.key(), json!(String::from_utf8_lossy(&c.value)))
                }).collect::<serde_json::Map<_, _>>(),
                "algorithm": s.algorithm.as_str(),
                "local_rate": s.rate,
                "per": s.per.as_str(),
                "burst": s.burst,
                "action": action,
                "enabled": s.enabled,
                "priority": s.priority,
                "slot": p.slot,
                "generation": p.generation,
                "slot_current": current,
                "passed": counters.passed,
                "limited": counters.limited,
                "delayed": counters.delayed,
                // Set by an nginx worker that does not define one of the
                // match's dimensions: the strategy never matches there.
                "dimension_undefined_in_nginx": current && undefined,
            }));
            if s.each.is_keyed() {
                let k = keys.counters(p.slot);
                let row = rows.last_mut().expect("just pushed");
                row["each"] = json!(s.each.dims);
                row["ipv4_prefix"] = json!(s.each.ipv4_prefix);
                row["ipv6_prefix"] = json!(s.each.ipv6_prefix);
                row["on_full"] = json!(s.each.on_full.as_str());
                row["keys"] = json!({
                    "in_use": if current { k.in_use } else { 0 },
                    "reclaims": if current { k.reclaims } else { 0 },
                    "full": if current { k.full } else { 0 },
                    "overflow_admits": if current { k.overflow_admits } else { 0 },
                    "capped": if current { k.capped } else { 0 },
                });
                // The cap the workers apply (0 in the file: half the table).
                row["max_keys"] = json!(keys.cap(s.each.max_keys));
            }
            if !s.tz.is_empty() {
                // Issue 33: the calendar windows' zone.
                let row = rows.last_mut().expect("just pushed");
                row["tz"] = json!(s.tz);
            }
            if !s.response.is_plain() {
                // Issue 31: the response options and their counters.
                let r = keys.settled(p.slot);
                let row = rows.last_mut().expect("just pushed");
                if !s.response.count_if.is_empty() {
                    row["count_if"] = json!(s.response.count_if.to_string());
                }
                for (k, v) in [
                    ("cost_from", &s.response.cost_from),
                    ("cost_after", &s.response.cost_after),
                ] {
                    if !v.is_empty() {
                        row[k] = json!(v);
                    }
                }
                row["response"] = json!({
                    "charged_after": if current { r.charged_after } else { 0 },
                    "given_back": if current { r.given_back } else { 0 },
                    "not_counted": if current { r.not_counted } else { 0 },
                });
            }
        }
    }
    let blacklist_entries = Blacklist::open(map.blacklist())
        .map(|b| b.len() as u64)
        .map_err(|e| Failure::other(format!("blacklist region: {e}")))?;
    let used_slots: u32 = (0..g.bitmap_len as usize / 8)
        .map(|i| map.bitmap().load(i * 8).count_ones())
        .sum();
    let summary = json!({
        "path": path.display().to_string(),
        "layout_version": LAYOUT_VERSION,
        "file_size": g.file_size,
        "sequence": seq,
        "active_segment": if seq == 0 { serde_json::Value::Null } else { json!(if seq & 1 == 0 { "A" } else { "B" }) },
        "config_version": header.load(H_CONFIG_VERSION),
        "published_unix_ms": decoded.as_ref().map(|d| d.published_unix_ms),
        "heartbeat_unix_ms": heartbeat,
        "heartbeat_age_ms": heartbeat_age_ms,
        "writer_pid": header.load(H_WRITER_PID),
        "created_unix_ms": header.load(H_CREATED),
        "capacity": {
            "strategies": g.slot_count,
            "segment_bytes": g.seg_len,
            "blacklist_entries": g.bl_capacity,
            "keys": g.keys_capacity,
        },
        "key_table": {
            "capacity": keys.capacity(),
            "occupied": keys.scan_occupied(),
            "max_probe": keys.stats().max_probe,
            "claims": keys.stats().claims,
            "bytes_per_key": rate_ctl::core::keys::ENTRY_BYTES,
        },
        "ban_table": ban_table_json(&map),
        "slots_in_use": used_slots,
        "blacklist_entries": blacklist_entries,
        "blacklist_dimensions": decoded.as_ref().map(|d| d.blacklist_dimensions.clone()).unwrap_or_default(),
        "strategies": rows.len(),
    });
    if as_json {
        let mut doc = summary;
        doc["strategies"] = serde_json::Value::Array(rows);
        outln!(
            "{}",
            serde_json::to_string_pretty(&doc).expect("serialisable")
        );
        return Ok(());
    }
    outln!("file:            {}", path.display());
    outln!("layout version:  {LAYOUT_VERSION}, {} bytes", g.file_size);
    outln!(
        "sequence:        {seq} (active segment {})",
        summary["active_segment"]
            .as_str()
            .unwrap_or("none: nothing published")
    );
    outln!("config version:  {}", summary["config_version"]);
    match heartbeat_age_ms {
        Some(a) => outln!(
            "agent heartbeat: {:.1} s ago (pid {})",
            a as f64 / 1000.0,
            summary["writer_pid"]
        ),
        None => outln!("agent heartbeat: never"),
    }
    outln!(
        "capacity:        {} strategies ({} slots in use), {} segment bytes, {} blacklist entries",
        g.slot_count,
        used_slots,
        g.seg_len,
        g.bl_capacity
    );
    outln!("blacklist:       {blacklist_entries} entries");
    let kt = &summary["key_table"];
    outln!(
        "key table:       {} of {} entries in use ({} bytes each), longest probe {}",
        kt["occupied"],
        kt["capacity"],
        kt["bytes_per_key"],
        kt["max_probe"]
    );
    let bt = &summary["ban_table"];
    outln!(
        "ban table:       {} of {} rows banned, {} bans raised, {} rejections not counted (no free row), {} would-bans (dry run)",
        bt["banned_rows"],
        bt["capacity"],
        bt["raised"],
        bt["full"],
        bt["would_ban"]
    );
    outln!("strategies:      {}", rows.len());
    if !rows.is_empty() {
        outln!(
            "{:>8} {:<14} {:>10} {:<7} {:>6} {:>6} {:>12} {:>12} {:>10}  MATCH",
            "ID",
            "ALGORITHM",
            "LOCAL RATE",
            "PER",
            "BURST",
            "SLOT",
            "PASSED",
            "LIMITED",
            "DELAYED"
        );
        for r in &rows {
            let mut m: Vec<String> = r["match"]
                .as_object()
                .map(|o| {
                    o.iter()
                        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                        .collect()
                })
                .unwrap_or_default();
            if m.is_empty() {
                m.push("(all requests)".into());
            }
            if let Some(each) = r["each"].as_array() {
                let dims: Vec<&str> = each.iter().filter_map(|d| d.as_str()).collect();
                let k = &r["keys"];
                m.push(format!(
                    "each={} (keys {}, reclaims {}, on_full {} {}, max_keys {} capped {})",
                    dims.join(","),
                    k["in_use"],
                    k["reclaims"],
                    r["on_full"].as_str().unwrap_or(""),
                    k["full"],
                    r["max_keys"],
                    k["capped"]
                ));
            }
            let n = |k: &str| r[k].to_string();
            outln!(
                "{:>8} {:<14} {:>10} {:<7} {:>6} {:>6} {:>12} {:>12} {:>10}  {}",
                n("id"),
                r["algorithm"].as_str().unwrap_or(""),
                n("local_rate"),
                r["per"].as_str().unwrap_or(""),
                n("burst"),
                n("slot"),
                n("passed"),
                n("limited"),
                n("delayed"),
                m.join(" ")
            );
        }
        let undefined: Vec<String> = rows
            .iter()
            .filter(|r| r["dimension_undefined_in_nginx"] == true)
            .map(|r| r["id"].to_string())
            .collect();
        if !undefined.is_empty() {
            outln!(
                "never match: strategies {} use a dimension nginx does not define (see its error log)",
                undefined.join(", ")
            );
        }
    }
    Ok(())
}

/// The penalty box's ban table (issue 32): its header counters.
fn ban_table_json(map: &Mapping) -> serde_json::Value {
    let t = map.bans();
    let s = t.stats();
    json!({
        "capacity": t.capacity(),
        "banned_rows": s.banned_rows,
        "raised": s.raised,
        "full": s.full,
        "too_long": s.too_long,
        "would_ban": s.would,
    })
}
