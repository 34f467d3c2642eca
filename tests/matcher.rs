//! The matcher against brute force: a strategy matches exactly when every
//! one of its conditions equals the request's value of that dimension.

use proptest::prelude::*;
use rate_ctl::core::model::{Action, Algorithm, Condition, Strategy, Unit};
use rate_ctl::core::segment::{Decoded, Published};
use rate_ctl::core::table::Table;

const DIMS: [&str; 4] = ["ip", "userid", "api", "method"];
const VALUES: [&str; 4] = ["a", "b", "c", "unnamed"];

fn value(d: usize, v: usize) -> String {
    if DIMS[d] == "ip" {
        format!("10.0.0.{v}")
    } else {
        VALUES[v].to_string()
    }
}

/// A strategy: for each dimension, maybe a condition on one of 3 values.
fn strategy_spec() -> impl proptest::strategy::Strategy<Value = [Option<usize>; 4]> {
    proptest::array::uniform4(proptest::option::of(0usize..3))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, .. ProptestConfig::default() })]

    #[test]
    fn matching_equals_brute_force(
        specs in proptest::collection::vec(strategy_spec(), 0..60),
        requests in proptest::collection::vec(proptest::array::uniform4(proptest::option::of(0usize..4)), 1..20),
        disabled in proptest::collection::vec(any::<bool>(), 60),
    ) {
        let published: Vec<Published> = specs
            .iter()
            .enumerate()
            .map(|(i, spec)| {
                let conditions = spec
                    .iter()
                    .enumerate()
                    .filter_map(|(d, v)| v.map(|v| Condition::new(DIMS[d], value(d, v))))
                    .collect();
                Published {
                    strategy: Strategy {
                        id: i as u32 + 1,
                        conditions,
                        algorithm: Algorithm::TokenBucket,
                        rate: 10,
                        per: Unit::Second,
                        burst: 1,
                        action: Action::Reject { status: None },
                        enabled: !disabled[i],
                        warm_up: Default::default(),
                    },
                    slot: i as u32,
                    generation: 1,
                }
            })
            .collect();
        let table = Table::build(
            Decoded {
                publish_seq: 1,
                config_version: 1,
                published_unix_ms: 0,
                strategies: published.clone(),
                blacklist_dimensions: vec![],
            },
            None,
        );
        for req in requests {
            // Request value per dimension; 3 is a value no strategy names.
            let texts: Vec<Option<String>> =
                (0..4).map(|d| req[d].map(|v| value(d, v))).collect();
            let values: Vec<Option<&[u8]>> = table
                .dimensions()
                .iter()
                .map(|name| {
                    let d = DIMS.iter().position(|x| x == name).unwrap();
                    texts[d].as_deref().map(str::as_bytes)
                })
                .collect();
            let got = table.matching(&values);
            let got: Vec<u32> = got.iter().map(|&i| table.strategies()[i as usize].strategy.id).collect();
            let want: Vec<u32> = published
                .iter()
                .filter(|p| p.strategy.enabled)
                .filter(|p| {
                    p.strategy.conditions.iter().all(|c| {
                        let d = DIMS.iter().position(|x| *x == c.dimension).unwrap();
                        texts[d].as_deref().map(str::as_bytes) == Some(&c.value[..])
                    })
                })
                .map(|p| p.strategy.id)
                .collect();
            prop_assert_eq!(got, want);
        }
    }
}
