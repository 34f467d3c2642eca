//! The penalty box flags of `strategy add` and `update` (issue 32):
//! `--ban-after N --ban-within DURATION --ban-for DURATION`.

use clap::Args;

use crate::store::record::StrategyRecord;

/// `--ban-within` / `--ban-for`: seconds, or with a unit (`10s`, `5m`,
/// `2h`, `1d`); the range (1 s … 30 days) is the model's check.
fn parse_secs(s: &str) -> Result<u32, String> {
    let v = rate_ctl::core::model::ban::parse_secs("duration", s)
        .map_err(|e| e.to_string().trim_start_matches("duration: ").to_string())?;
    u32::try_from(v).map_err(|_| format!("{v} seconds is more than 30 days"))
}

/// The penalty box: after `--ban-after` rejections of one key within
/// `--ban-within`, the key is banned for `--ban-for` on every host (as a
/// blacklist entry); per-key strategies with `--each ip` or `--each
/// userid` only.
#[derive(Args, Debug, Default)]
pub struct BanArgs {
    /// Penalty box: ban a key after this many rejections (1 …) within
    /// --ban-within (each ip or each userid only).
    #[arg(long, value_name = "N")]
    pub ban_after: Option<u32>,
    /// Penalty box: the window the rejections are counted in (1s … 30d).
    #[arg(long, value_name = "DURATION", value_parser = parse_secs)]
    pub ban_within: Option<u32>,
    /// Penalty box: how long a key is banned (1s … 30d).
    #[arg(long, value_name = "DURATION", value_parser = parse_secs)]
    pub ban_for: Option<u32>,
    /// Remove the strategy's penalty box (update only).
    #[arg(long, conflicts_with_all = ["ban_after", "ban_within", "ban_for"], hide = true)]
    pub no_ban: bool,
}

impl BanArgs {
    /// Applies the flags to `rec` (given ones replace, `--no-ban` clears).
    pub fn apply(&self, rec: &mut StrategyRecord) {
        if self.no_ban {
            (rec.ban_after, rec.ban_within, rec.ban_for) = (None, None, None);
        }
        rec.ban_after = self.ban_after.or(rec.ban_after);
        rec.ban_within = self.ban_within.or(rec.ban_within);
        rec.ban_for = self.ban_for.or(rec.ban_for);
    }
}
