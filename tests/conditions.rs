//! Condition operators (prefix `^=`, template `~=`, negation `!=`) in the
//! matcher against a naive model written apart from it, over random tables
//! (exact conditions mixed in, so anchored lists, tuple-space groups and
//! reanchoring all take part), and through the segment encoding.

#[path = "support/table.rs"]
mod tables;

use proptest::prelude::*;
use rate_ctl::core::model::{Condition, Op};
use rate_ctl::core::shm::segment::{decode_payload, encode_payload, Published};
use rate_ctl::core::table::Table;
use tables::{ids, table_of, token_bucket};

const DIMS: [&str; 3] = ["api", "userid", "method"];
const SEGS: [&str; 5] = ["a", "b", "c", "", "x*"];
const USERS: [&str; 4] = ["u1", "u2", "admin", "u3"];
const METHODS: [&str; 2] = ["GET", "POST"];

/// A request: a path of segments (`None`: no path), a user, a method.
type Req = (Option<Vec<usize>>, Option<usize>, Option<usize>);

fn path(segs: &[usize]) -> String {
    let mut p = String::new();
    for &s in segs {
        p.push('/');
        p.push_str(SEGS[s]);
    }
    if p.is_empty() {
        p.push('/');
    }
    p
}

/// The naive definition of each operator (module docs of `core::pattern`).
fn holds(op: Op, pattern: &str, v: Option<&str>) -> bool {
    match (op, v) {
        (Op::Not, None) => true,
        (_, None) => false,
        (Op::Exact, Some(v)) => v == pattern,
        (Op::Not, Some(v)) => v != pattern,
        (Op::Prefix, Some(v)) => v.starts_with(pattern),
        (Op::Template, Some(v)) => {
            let mut t: Vec<&str> = pattern.split('/').collect();
            let rest = t.len() > 1 && t.last() == Some(&"**");
            if rest {
                t.pop();
            }
            let s: Vec<&str> = v.split('/').collect();
            if s.len() < t.len() || (!rest && s.len() != t.len()) {
                return false;
            }
            t.iter().zip(&s).all(|(t, s)| match *t {
                "*" => !s.is_empty(),
                t => t.replace("\\*", "*") == *s,
            })
        }
    }
}

/// A condition spec: dimension, operator, value index.
type CondSpec = (usize, Op, usize, Vec<usize>);

fn cond(spec: &CondSpec) -> Condition {
    let (d, op, v, segs) = spec;
    let value = match (d, op) {
        (0, Op::Template) => {
            // Segments of the path, some `*`, maybe a rest.
            let mut t = String::new();
            for (i, &s) in segs.iter().enumerate() {
                t.push('/');
                if (v >> i) & 1 == 1 {
                    t.push('*');
                } else {
                    t.push_str(&SEGS[s].replace('*', "\\*"));
                }
            }
            if v & 16 != 0 {
                t.push_str("/**");
            }
            if t.is_empty() {
                t.push('/');
            }
            t
        }
        (0, Op::Prefix) => {
            let p = path(segs);
            p[..(1 + v % p.len()).min(p.len())].to_string()
        }
        (0, _) => path(segs),
        (1, _) => USERS[v % USERS.len()].to_string(),
        _ => METHODS[v % METHODS.len()].to_string(),
    };
    Condition::with_op(DIMS[*d], *op, value)
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    prop_oneof![
        Just(Op::Exact),
        Just(Op::Prefix),
        Just(Op::Template),
        Just(Op::Not)
    ]
}

fn cond_spec() -> impl proptest::strategy::Strategy<Value = CondSpec> {
    (
        0usize..3,
        op(),
        0usize..32,
        proptest::collection::vec(0usize..SEGS.len(), 0..4),
    )
        .prop_map(|(d, op, v, segs)| {
            // Prefixes and templates are for paths here.
            let op = match (d, op) {
                (1 | 2, Op::Prefix | Op::Template) => Op::Exact,
                (_, op) => op,
            };
            (d, op, v, segs)
        })
}

fn published(id: u32, conds: Vec<Condition>) -> Published {
    token_bucket(id, conds, true)
}

/// The strategies of `specs` that the model accepts (one condition per
/// dimension), ids from 1.
fn publish(specs: &[Vec<CondSpec>]) -> Vec<Published> {
    let mut out = Vec::new();
    for spec in specs {
        let mut conds: Vec<Condition> = Vec::new();
        for c in spec {
            let c = cond(c);
            if !conds.iter().any(|x| x.dimension == c.dimension) {
                conds.push(c);
            }
        }
        let p = published(out.len() as u32 + 1, conds);
        if p.strategy.check().is_ok() {
            out.push(p);
        }
    }
    out
}

fn table(published: &[Published]) -> Table {
    // Through the file's encoding: what a worker reads.
    let payload = encode_payload(published, &[]);
    let (strategies, _) = decode_payload(&payload, published.len() as u32, 0).unwrap();
    assert_eq!(strategies, published);
    table_of(strategies)
}

/// One working space for all of a table's requests, as the nginx worker
/// keeps: what one request leaves in it must not change the next one's
/// matches.
fn check(
    published: &[Published],
    table: &Table,
    req: &Req,
    scratch: &mut rate_ctl::core::table::Scratch,
) -> Result<(), TestCaseError> {
    let texts = [
        req.0.as_ref().map(|s| path(s)),
        req.1.map(|u| USERS[u].to_string()),
        req.2.map(|m| METHODS[m].to_string()),
    ];
    let values: Vec<Option<&[u8]>> = table
        .dimensions()
        .iter()
        .map(|name| {
            // Pseudo-dimensions are never asked for: none here.
            DIMS.iter()
                .position(|x| x == name)
                .and_then(|d| texts[d].as_deref().map(str::as_bytes))
        })
        .collect();
    let got: Vec<u32> = ids(table, &table.matching_with(&values, scratch));
    let want: Vec<u32> = published
        .iter()
        .filter(|p| {
            p.strategy.conditions.iter().all(|c| {
                let d = DIMS.iter().position(|x| *x == c.dimension).unwrap();
                holds(
                    c.op,
                    std::str::from_utf8(&c.value).unwrap(),
                    texts[d].as_deref(),
                )
            })
        })
        .map(|p| p.strategy.id)
        .collect();
    prop_assert_eq!(got, want, "request {:?}", texts);
    Ok(())
}

fn req() -> impl proptest::strategy::Strategy<Value = Req> {
    (
        proptest::option::weighted(0.9, proptest::collection::vec(0usize..SEGS.len(), 0..5)),
        proptest::option::of(0usize..USERS.len()),
        proptest::option::of(0usize..METHODS.len()),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn operators_match_as_the_naive_model(
        specs in proptest::collection::vec(proptest::collection::vec(cond_spec(), 0..4), 1..40),
        reqs in proptest::collection::vec(req(), 1..30),
    ) {
        let published = publish(&specs);
        let table = table(&published);
        let mut scratch = rate_ctl::core::table::Scratch::default();
        for r in &reqs {
            check(&published, &table, r, &mut scratch)?;
        }
        // And the conditions come back as published.
        for c in table.strategies() {
            let p = &published[c.strategy.id as usize - 1].strategy.conditions;
            let mut got = table.conditions(c);
            let mut want = p.clone();
            got.sort_by(|a, b| a.dimension.cmp(&b.dimension));
            want.sort_by(|a, b| a.dimension.cmp(&b.dimension));
            prop_assert_eq!(got, want);
        }
    }
}

/// The issue's examples, one table.
#[test]
fn the_issue_examples() {
    let p = vec![
        published(1, vec![Condition::with_op("api", Op::Prefix, "/api/v1/")]),
        published(
            2,
            vec![Condition::with_op("api", Op::Template, "/users/*/orders")],
        ),
        published(
            3,
            vec![
                Condition::with_op("userid", Op::Not, "admin"),
                Condition::new("api", "/n"),
            ],
        ),
        published(4, vec![Condition::with_op("method", Op::Not, "GET")]),
    ];
    let t = table(&p);
    let ids = |api: &str, user: Option<&str>, method: &str| -> Vec<u32> {
        let pairs: Vec<(&str, &[u8])> = [
            Some(("api", api.as_bytes())),
            user.map(|u| ("userid", u.as_bytes())),
            Some(("method", method.as_bytes())),
        ]
        .into_iter()
        .flatten()
        .collect();
        let v = t.values_of(&pairs);
        tables::ids(&t, &t.matching(&v))
    };
    assert_eq!(ids("/api/v1/a", None, "GET"), vec![1]);
    assert_eq!(ids("/api/v1/", None, "GET"), vec![1]);
    assert_eq!(ids("/api/v2/a", None, "GET"), Vec::<u32>::new());
    assert_eq!(ids("/users/1/orders", None, "GET"), vec![2]);
    assert_eq!(ids("/users/1/2/orders", None, "GET"), Vec::<u32>::new());
    assert_eq!(ids("/users/1/orders/9", None, "GET"), Vec::<u32>::new());
    assert_eq!(ids("/n", Some("admin"), "GET"), Vec::<u32>::new());
    assert_eq!(ids("/n", Some("bob"), "GET"), vec![3]);
    assert_eq!(ids("/n", None, "GET"), vec![3]);
    assert_eq!(ids("/n", None, "POST"), vec![3, 4]);
    // A table of only negations still matches (no fast path skips it).
    let only = table(&[published(
        1,
        vec![Condition::with_op("method", Op::Not, "GET")],
    )]);
    let m = |method: &str| only.matching(&only.values_of(&[("method", method.as_bytes())]));
    assert_eq!(m("GET"), Vec::<u32>::new());
    assert_eq!(m("POST"), vec![0]);
}

#[test]
fn bad_patterns_are_refused_naming_the_condition() {
    for (c, want) in [
        (
            Condition::with_op("api", Op::Prefix, ""),
            "conditions[0].value",
        ),
        (
            Condition::with_op("api", Op::Template, "***"),
            "not a path template",
        ),
        (
            Condition::with_op("api", Op::Template, "/a*"),
            "whole segment",
        ),
        (
            Condition::with_op("ip", Op::Not, "10.0.0.1"),
            "ip takes only =",
        ),
    ] {
        let p = published(1, vec![c]);
        let e = p.strategy.check().unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    }
}

/// For profiling (`valgrind --tool=callgrind … --ignored profile_`): the
/// bench-instructions `template` table without the friendly strategies.
#[test]
#[ignore]
fn profile_template_matching() {
    let mut p = Vec::new();
    for i in 1..=1000u32 {
        let t = match i % 3 {
            0 => format!("/t{i}/*/x"),
            1 => format!("/t{i}/*"),
            _ => format!("/t{i}/*/**"),
        };
        p.push(published(
            i,
            vec![Condition::with_op("api", Op::Template, t)],
        ));
    }
    p.push(published(
        1001,
        vec![Condition::with_op("api", Op::Template, "/bench/**")],
    ));
    let t = table(&p);
    println!("dims {:?}", t.dimensions());
    let v = t.values_of(&[("api", b"/bench")]);
    let mut s = rate_ctl::core::table::Scratch::default();
    let mut n = 0;
    for _ in 0..100_000 {
        n += t.matching_with(&v, &mut s).len();
    }
    assert_eq!(n, 100_000);
}
