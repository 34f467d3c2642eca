//! `$rate_ctl_status`: the decision a request ends with, as recorded per
//! request by the handler and read back by the variables. A leaf: no nginx
//! calls.

/// `$rate_ctl_status` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReqStatus {
    Passed,
    Delayed,
    Rejected,
    Blacklisted,
    DryRunRejected,
    FailOpen,
    /// A dry run would have delayed the request (nginx: `DELAYED_DRY_RUN`).
    DryRunDelayed,
    /// An `allow` strategy let the request through unlimited.
    Allowed,
}

impl ReqStatus {
    /// 1..=8, as recorded per request (0 is "not decided").
    #[inline]
    pub fn code(self) -> u32 {
        match self {
            ReqStatus::Passed => 1,
            ReqStatus::Delayed => 2,
            ReqStatus::Rejected => 3,
            ReqStatus::Blacklisted => 4,
            ReqStatus::DryRunRejected => 5,
            ReqStatus::FailOpen => 6,
            ReqStatus::DryRunDelayed => 7,
            ReqStatus::Allowed => 8,
        }
    }

    #[inline]
    pub fn from_code(code: u32) -> Option<ReqStatus> {
        Some(match code {
            1 => ReqStatus::Passed,
            2 => ReqStatus::Delayed,
            3 => ReqStatus::Rejected,
            4 => ReqStatus::Blacklisted,
            5 => ReqStatus::DryRunRejected,
            6 => ReqStatus::FailOpen,
            7 => ReqStatus::DryRunDelayed,
            8 => ReqStatus::Allowed,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ReqStatus::Passed => "PASSED",
            ReqStatus::Delayed => "DELAYED",
            ReqStatus::Rejected => "REJECTED",
            ReqStatus::Blacklisted => "BLACKLISTED",
            ReqStatus::DryRunRejected => "DRY_RUN_REJECTED",
            ReqStatus::FailOpen => "FAIL_OPEN",
            ReqStatus::DryRunDelayed => "DRY_RUN_DELAYED",
            ReqStatus::Allowed => "ALLOWED",
        }
    }
}
