//! The worker's log line of the penalty box (issue 32): a key banned on
//! this host, or a dry run's "would ban". Rare (once per ban, once per
//! `ban_after` rejections in a dry run), so not summarised.

use ngx::http::Request;
use ngx::ngx_log_error;

use super::conf::LocConf;
use crate::core::bans::Counted;
use crate::core::table::BanEvent;

/// Logs what a rejection did to its key's ban count (a ban, a dry run's
/// would-be ban, or a ban table with no row for the key); `key` the key as
/// text (escaped by the table).
#[cold]
#[inline(never)]
pub fn log_ban(lc: &LocConf, r: &Request, e: BanEvent, key: Option<String>) {
    let id = e.strategy_id;
    let key = key.as_deref().unwrap_or("?");
    let level = lc.log_level();
    match e.counted {
        Counted::Banned { until_ms, count } => {
            ngx_log_error!(
                level.ngx_level(),
                r.log(),
                "rate_ctl: strategy {id}: banned {key} on this host after {count} rejections \
                 (penalty box, until unix ms {until_ms})"
            );
        }
        Counted::WouldBan { count } => {
            ngx_log_error!(
                level.ngx_level(),
                r.log(),
                "rate_ctl: strategy {id}: would ban {key} after {count} rejections (dry run: nobody is banned)"
            );
        }
        Counted::Full => {
            ngx_log_error!(
                level.lower().ngx_level(),
                r.log(),
                "rate_ctl: strategy {id}: the ban table has no free row for {key}: its rejections are not counted"
            );
        }
        Counted::Counted(_) | Counted::TooLong => {}
    }
}
