//! Helpers shared by the matcher tests: a published token bucket on given
//! conditions, the table a worker builds from published strategies, and
//! the strategy ids of a match.
#![allow(dead_code)]

use rate_ctl::core::model::{Action, Algorithm, Condition, Strategy, Unit};
use rate_ctl::core::shm::segment::{Decoded, Published};
use rate_ctl::core::table::Table;

/// Strategy `id` in slot `id - 1`: a token bucket of 10 a second (burst 1,
/// rejecting) on `conditions`.
pub fn token_bucket(id: u32, conditions: Vec<Condition>, enabled: bool) -> Published {
    Published {
        strategy: Strategy {
            id,
            conditions,
            algorithm: Algorithm::TokenBucket,
            rate: 10,
            per: Unit::Second,
            burst: 1,
            action: Action::Reject { status: None },
            enabled,
            warm_up: Default::default(),
            priority: 0,
            each: Default::default(),
            name: String::new(),
            response: Default::default(),
            tz: String::new(),
            ban: None,
        },
        slot: id - 1,
        generation: 1,
    }
}

/// The table of `strategies` (publish 1, config version 1, no blacklist).
pub fn table_of(strategies: Vec<Published>) -> Table {
    Table::build(
        Decoded {
            publish_seq: 1,
            config_version: 1,
            published_unix_ms: 0,
            strategies,
            blacklist_dimensions: vec![],
        },
        None,
    )
}

/// The strategy ids of the table indices a match returned.
pub fn ids(table: &Table, matched: &[u32]) -> Vec<u32> {
    matched
        .iter()
        .map(|&i| table.strategies()[i as usize].strategy.id)
        .collect()
}
