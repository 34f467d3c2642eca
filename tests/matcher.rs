//! The matcher against brute force: a strategy matches exactly when every
//! one of its conditions equals the request's value of that dimension.
//! Small random tables (few shared values: anchored lists), dense random
//! tables of many shapes and grids (long lists: tuple-space groups).

#[path = "support/table.rs"]
mod tables;

use proptest::prelude::*;
use rate_ctl::core::model::Condition;
use rate_ctl::core::shm::segment::Published;
use rate_ctl::core::table::Table;
use tables::{ids, table_of, token_bucket};

const DIMS: [&str; 4] = ["ip", "userid", "api", "method"];
const VALUES: [&str; 8] = ["a", "b", "c", "d", "e", "f", "g", "unnamed"];

fn value(d: usize, v: usize) -> String {
    if DIMS[d] == "ip" {
        format!("10.0.0.{v}")
    } else if v < VALUES.len() {
        VALUES[v].to_string()
    } else {
        format!("v{v}")
    }
}

/// A strategy: for each dimension, maybe a condition on one of `values` values.
fn strategy_spec(values: usize) -> impl proptest::strategy::Strategy<Value = [Option<usize>; 4]> {
    proptest::array::uniform4(proptest::option::of(0usize..values))
}

fn strategy(id: u32, spec: &[Option<usize>; 4], enabled: bool) -> Published {
    let conditions = spec
        .iter()
        .enumerate()
        .filter_map(|(d, v)| v.map(|v| Condition::new(DIMS[d], value(d, v))))
        .collect();
    token_bucket(id, conditions, enabled)
}

fn table(published: &[Published]) -> Table {
    table_of(published.to_vec())
}

/// The ids `table` matches for a request (a value per dimension, `None`:
/// absent) and the ids brute force finds.
fn got_and_want(
    table: &Table,
    published: &[Published],
    req: &[Option<usize>; 4],
) -> (Vec<u32>, Vec<u32>) {
    let texts: Vec<Option<String>> = (0..4).map(|d| req[d].map(|v| value(d, v))).collect();
    let values: Vec<Option<&[u8]>> = table
        .dimensions()
        .iter()
        .map(|name| {
            let d = DIMS.iter().position(|x| x == name).unwrap();
            texts[d].as_deref().map(str::as_bytes)
        })
        .collect();
    let got = ids(table, &table.matching(&values));
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
    (got, want)
}

/// Strategy `i + 1` from `specs[i]`, enabled as `enabled(i)` says.
fn publish_all(specs: &[[Option<usize>; 4]], enabled: impl Fn(usize) -> bool) -> Vec<Published> {
    specs
        .iter()
        .enumerate()
        .map(|(i, spec)| strategy(i as u32 + 1, spec, enabled(i)))
        .collect()
}

/// The table of [`publish_all`]: every request gets from it what brute
/// force gives.
fn equal_brute_force(
    specs: &[[Option<usize>; 4]],
    requests: &[[Option<usize>; 4]],
    enabled: impl Fn(usize) -> bool,
) -> Result<(), TestCaseError> {
    let published = publish_all(specs, enabled);
    let table = table(&published);
    for req in requests {
        let (got, want) = got_and_want(&table, &published, req);
        prop_assert_eq!(got, want);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, .. ProptestConfig::default() })]

    #[test]
    fn matching_equals_brute_force(
        specs in proptest::collection::vec(strategy_spec(3), 0..60),
        requests in proptest::collection::vec(proptest::array::uniform4(proptest::option::of(0usize..4)), 1..20),
        disabled in proptest::collection::vec(any::<bool>(), 60),
    ) {
        equal_brute_force(&specs, &requests, |i| !disabled[i])?;
    }

    /// Many strategies over few values: long anchored lists of several
    /// shapes, most of them probed by shape (tuple-space groups), some
    /// not (too many shapes for their length), plus duplicates.
    #[test]
    fn dense_multi_shape_tables_equal_brute_force(
        specs in proptest::collection::vec(strategy_spec(5), 50..400),
        requests in proptest::collection::vec(proptest::array::uniform4(proptest::option::of(0usize..6)), 1..40),
    ) {
        equal_brute_force(&specs, &requests, |i| i % 17 != 3)?;
    }
}

/// A 20 × 20 grid `userid=ui AND api=aj`, a second grid over three
/// dimensions, single-condition strategies on the grid's values and
/// strategies of other shapes sharing them: every request of the value
/// space (present or absent per dimension) against brute force, and the
/// grid really probed by shape.
#[test]
fn grids_with_other_shapes_equal_brute_force() {
    let mut specs: Vec<[Option<usize>; 4]> = Vec::new();
    for i in 0..20 {
        for j in 0..20 {
            specs.push([None, Some(i), Some(j), None]);
        }
    }
    for i in 0..6 {
        for j in 0..6 {
            for k in 0..3 {
                specs.push([Some(k), Some(i), None, Some(j)]);
            }
        }
    }
    for i in 0..20 {
        specs.push([None, Some(i), None, None]);
        specs.push([None, None, Some(i), None]);
        specs.push([Some(i % 4), None, Some(i), None]);
        specs.push([None, Some(i), None, Some(i % 3)]);
    }
    specs.push([None, Some(5), Some(5), None]); // a duplicate of a grid cell
    specs.push([None; 4]); // matches every request
    let published = publish_all(&specs, |_| true);
    let table = table(&published);
    assert!(table.shape_groups() >= 2, "the grids are probed by shape");
    let axis = |n: usize| std::iter::once(None).chain((0..n).map(Some));
    let mut requests = 0;
    for ip in axis(5) {
        for user in axis(21) {
            for api in axis(21) {
                for method in axis(7) {
                    let req = [ip, user, api, method];
                    let (got, want) = got_and_want(&table, &published, &req);
                    assert_eq!(got, want, "request {req:?}");
                    requests += 1;
                }
            }
        }
    }
    assert_eq!(requests, 6 * 22 * 22 * 8);
}

/// A dimension strategies name only beside their anchor (`method` here:
/// every strategy is anchored under its unique `userid`) is read from the
/// request only when it has candidates to check: a request matching none
/// of those strategies never asks for it (in nginx, a variable or a query
/// string scan saved), one that has candidates does, and both match as
/// brute force says.
#[test]
fn dimensions_named_only_beside_an_anchor_are_read_only_for_candidates() {
    use std::cell::RefCell;
    struct Counting<'a> {
        values: Vec<Option<&'a [u8]>>,
        reads: RefCell<Vec<usize>>,
    }
    impl rate_ctl::core::table::Values for Counting<'_> {
        fn value(&self, dim: usize) -> Option<&[u8]> {
            self.reads.borrow_mut().push(dim);
            self.values.get(dim).copied().flatten()
        }
    }
    let published: Vec<Published> = (0..50)
        .map(|i| {
            strategy(
                i as u32 + 1,
                &[None, Some(100 + i), None, Some(i % 3)],
                true,
            )
        })
        .chain([strategy(51, &[None, None, Some(0), None], true)])
        .collect();
    let table = table(&published);
    let method = table.dimension_index("method").unwrap();
    let user = table.dimension_index("userid").unwrap();
    let api = table.dimension_index("api").unwrap();
    let run = |user_v: &str, api_v: &str| {
        let mut values = vec![None; table.dimensions().len()];
        values[user] = Some(user_v.as_bytes());
        values[api] = Some(api_v.as_bytes());
        values[method] = Some(b"b".as_slice()); // value(3, 1)
        let req = Counting {
            values,
            reads: RefCell::new(Vec::new()),
        };
        let ids: Vec<u32> = ids(&table, &table.matching(&req));
        (ids, req.reads.into_inner())
    };
    // No candidate (an unknown user, api `a` matches strategy 51 alone).
    let (ids, reads) = run("nobody", "a");
    assert_eq!(ids, [51]);
    assert!(
        !reads.contains(&method),
        "method read without candidates: {reads:?}"
    );
    // User v101 anchors strategy 2 (method b): method is read and checked.
    let (ids, reads) = run("v101", "a");
    assert_eq!(ids, [2, 51]);
    assert!(reads.contains(&method));
    let (ids, _) = run("v102", "none");
    assert!(ids.is_empty(), "strategy 3 wants method c: {ids:?}");
}

/// A grid whose second dimension anchors nothing (`userid=ui AND
/// method=mj`, 20 × 7 with holes: every userid value holds a row, no
/// method value anchors a strategy): its rows are found by the bytes of
/// the request's method, without interning it. Beside it, strategies of
/// other shapes anchored under the same userid values (so a row may be
/// one list among several, then probed by ids), a duplicate cell, and
/// method values named by no strategy: every request of the value space
/// against brute force.
#[test]
fn grids_on_a_checked_dimension_equal_brute_force() {
    let mut specs: Vec<[Option<usize>; 4]> = Vec::new();
    for i in 0..20 {
        for j in 0..7 {
            if (i + j) % 5 != 0 {
                specs.push([None, Some(i), None, Some(j)]);
            }
        }
    }
    specs.push([None, Some(3), None, Some(4)]); // a duplicate of a cell
    for i in 0..10 {
        // Other lists for the same request: userid + api anchored under
        // api's unique values, and api alone.
        specs.push([None, Some(i), Some(10 + i), None]);
        specs.push([None, None, Some(10 + i), None]);
    }
    let published = publish_all(&specs, |_| true);
    // (src/core/table/tests.rs checks that such a grid is found by bytes.)
    let table = table(&published);
    let axis = |n: usize| std::iter::once(None).chain((0..n).map(Some));
    let mut requests = 0;
    for user in axis(21) {
        for api in [None, Some(0), Some(12), Some(25)] {
            for method in axis(9) {
                let req = [None, user, api, method];
                let (got, want) = got_and_want(&table, &published, &req);
                assert_eq!(got, want, "request {req:?}");
                requests += 1;
            }
        }
    }
    assert_eq!(requests, 22 * 4 * 10);
}
