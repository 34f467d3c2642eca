//! Issue 31: the n-unit step math of every algorithm (shared and per key)
//! and the charge after the response, against the one-unit steps; the
//! response and cost fields through the CLI, the store (migration 131),
//! export/import and the REST API.

#[path = "support/cli.rs"]
mod cli;
#[path = "support/limiter.rs"]
mod limiter;
#[path = "support/serve.rs"]
mod serve;

use cli::{add_refused, add_strategy, ok, reimport, stores, strategy_rows as rows};
use limiter::{strategy, with_slots, words, S};
use std::sync::atomic::Ordering;

use proptest::prelude::*;
use rate_ctl::core::keys::{KeyLimiter, Step};
use rate_ctl::core::limiter::{Acquired, Limiter};
use rate_ctl::core::model::{Action, Algorithm, Unit};
use serde_json::{json, Value};

/// The algorithms that count units, with a rate per `per` and a burst.
fn counting() -> impl Strategy<Value = (Algorithm, u64, Unit, u32, Action)> {
    prop_oneof![
        (1u64..50, 1u32..50).prop_map(|(r, b)| (
            Algorithm::TokenBucket,
            r,
            Unit::Second,
            b,
            Action::Reject { status: None }
        )),
        (1u64..50, 1u32..20, 1u32..3000).prop_map(|(r, b, d)| (
            Algorithm::TokenBucket,
            r,
            Unit::Second,
            b,
            Action::Delay { max_delay_ms: d }
        )),
        (1u64..50).prop_map(|r| (
            Algorithm::LeakyBucket,
            r,
            Unit::Second,
            1,
            Action::Delay { max_delay_ms: 2000 }
        )),
        (1u64..60).prop_map(|r| (
            Algorithm::FixedWindow,
            r,
            Unit::Second,
            0,
            Action::Reject { status: None }
        )),
        (1u64..60).prop_map(|r| (
            Algorithm::SlidingWindow,
            r,
            Unit::Second,
            0,
            Action::Reject { status: None }
        )),
    ]
}

proptest! {
    /// `acquire_units(n)` admits exactly when `n` one-unit acquires in a
    /// row would all be admitted, and leaves the state they leave (nothing
    /// moved when refused); its refund gives all `n` back.
    #[test]
    fn n_units_are_n_one_unit_steps_at_once(
        (alg, rate, per, burst, action) in counting(),
        before in 0u64..40,
        n in 1u64..40,
        at_ms in 0u64..5000,
    ) {
        let l = Limiter::from_strategy(&strategy(alg, rate, per, burst, action));
        let t0 = 1_700_000_000 * S;
        with_slots(|one, many| {
            for i in 0..before {
                let now = t0 + i * S / 97;
                let _ = l.acquire(one, now);
                let _ = l.acquire(many, now);
            }
            prop_assert_eq!(words(one), words(many));
            let now = t0 + at_ms * 1_000_000;
            let start = words(one);
            let mut all = true;
            for _ in 0..n {
                all &= l.acquire(one, now).is_admitted();
            }
            match l.acquire_units(many, now, n) {
                Acquired::Admitted(r) => {
                    prop_assert!(all, "{alg}: {n} units admitted, {n} steps were not");
                    prop_assert_eq!(words(one), words(many), "{}: state after {} units", alg, n);
                    l.refund_units(many, r, n);
                    prop_assert_eq!(words(many), start, "{}: refund of {} units", alg, n);
                }
                Acquired::Rejected { retry_after_ns } => {
                    prop_assert!(!all, "{alg}: {n} units refused, {n} steps were admitted");
                    prop_assert_eq!(words(many), start, "{}: a refusal charged", alg);
                    prop_assert!(retry_after_ns >= 1);
                }
            }
            Ok(())
        })?;
    }

    /// The charge after the response: `+d` is `d` units over the limit if
    /// need be (a window counts them, a bucket owes them), `-d` in the
    /// same window gives them back exactly.
    #[test]
    fn a_charge_after_the_response_and_its_give_back_cancel(
        (alg, rate, per, burst, action) in counting(),
        before in 0u64..10,
        d in 1i64..100,
    ) {
        let l = Limiter::from_strategy(&strategy(alg, rate, per, burst, action));
        let now = 1_700_000_000 * S + 250_000_000;
        with_slots(|s, _| {
            for _ in 0..before {
                let _ = l.acquire(s, now);
            }
            let start = words(s);
            let q0 = l.quota(s, now).remaining;
            l.charge_after(s, now, now, d);
            prop_assert!(l.quota(s, now).remaining <= q0.saturating_sub(d as u64));
            // A bucket's debt stops at its cap (see the debt test): only
            // an uncapped charge is given back exactly.
            let capped = alg.is_bucket()
                && words(s).0 - start.0.max(now) < d as u64 * (S / rate);
            l.charge_after(s, now, now, -d);
            if capped {
                return Ok(());
            }
            if alg.is_window() || start.0 >= now {
                // The same quota (a window's count 0 whatever its index).
                prop_assert_eq!(l.quota(s, now).remaining, q0, "{}: +{} then -{}", alg, d, d);
            }
            if alg.is_bucket() && start.0 >= now {
                prop_assert_eq!(words(s), start, "{}: +{} then -{}", alg, d, d);
            }
            Ok(())
        })?;
    }

    /// The per-key form: `charge_after(+d)` then `(-d)` in the window it
    /// was charged in is the identity, and `+d` makes the key's word what
    /// `d` admitted one-unit steps would (while they fit).
    #[test]
    fn per_key_charge_after_matches_the_steps(
        (alg, rate, per, burst, action) in counting(),
        before in 0u64..10,
        d in 1u64..30,
    ) {
        let lim = KeyLimiter::from_strategy(&strategy(alg, rate, per, burst, action)).unwrap();
        let now = 1_700_000_000 * S + 250_000_000;
        let mut w = 0;
        for _ in 0..before {
            if let Step::Admit { next, .. } = lim.step(w, now) {
                w = next;
            }
        }
        let mut stepped = Some(w);
        for _ in 0..d {
            stepped = match stepped.map(|x| lim.step(x, now)) {
                Some(Step::Admit { next, .. }) => Some(next),
                _ => None,
            };
        }
        // n units at once are d steps (or refused, leaving nothing).
        match lim.step_units(w, now, d) {
            Step::Admit { next, .. } => prop_assert_eq!(Some(next), stepped, "{}: {} units", alg, d),
            Step::Reject { retry_after_ns } => {
                prop_assert!(stepped.is_none(), "{}: {} units refused, {} steps fit", alg, d, d);
                prop_assert!(retry_after_ns >= 1);
            }
        }
        let charged = lim.charge_after(w, now, now, d as i64).unwrap();
        if let Some(x) = stepped {
            prop_assert_eq!(charged, x, "{}: +{} against {} steps", alg, d, d);
        }
        prop_assert!(lim.quota(charged, now).remaining <= lim.quota(w, now).remaining);
        let back = lim.charge_after(charged, now, now, -(d as i64)).unwrap_or(charged);
        if alg.is_window() || w >= now {
            // The same state (a count of 0 is a fresh key whatever its window).
            prop_assert_eq!(lim.quota(back, now), lim.quota(w, now), "{}: +{} then -{}", alg, d, d);
        }
    }
}

/// A bucket in debt refuses until the debt is paid; the debt is capped so
/// that the agent's repair never takes it for foreign state.
#[test]
fn a_bucket_in_debt_waits_until_it_is_paid() {
    // 10/s, burst 10: T = 100 ms.
    let l = Limiter::from_strategy(&strategy(
        Algorithm::TokenBucket,
        10,
        Unit::Second,
        10,
        Action::Reject { status: None },
    ));
    let now = 1_000 * S;
    with_slots(|s, _| {
        assert!(l.acquire(s, now).is_admitted());
        // The response said 30: 29 more, 20 past the burst.
        l.charge_after(s, now, now, 29);
        match l.acquire(s, now) {
            Acquired::Rejected { retry_after_ns } => assert_eq!(retry_after_ns, 2_100_000_000),
            a => panic!("admitted in debt: {a:?}"),
        }
        assert!(!l.acquire(s, now + 2_099_999_999).is_admitted());
        assert!(l.acquire(s, now + 2_100_000_000).is_admitted());
        // A huge cost stops at the cap (horizon + 30 s).
        l.charge_after(s, now, now, 1_000_000);
        let tat = s.state0().load(Ordering::Relaxed);
        assert_eq!(tat, now + S + 30 * S);
        assert!(!l.repair_foreign(s, || now));
    });
}

/// A window charged after the response stays full until it ends; the
/// give-back of a request admitted in a window that has ended touches
/// nothing.
#[test]
fn a_window_charged_after_the_response_stays_full_until_it_ends() {
    let l = Limiter::from_strategy(&strategy(
        Algorithm::FixedWindow,
        10,
        Unit::Minute,
        0,
        Action::Reject { status: None },
    ));
    let t = 1_700_000_080 * S; // 40 s into a minute
    with_slots(|s, _| {
        assert!(l.acquire(s, t).is_admitted());
        l.charge_after(s, t, t, 50);
        assert!(!l.acquire(s, t + 19 * S).is_admitted());
        assert!(l.acquire(s, t + 20 * S).is_admitted());
        let w = words(s);
        // Admitted at t (the last window), given back now: no effect.
        l.charge_after(s, t + 21 * S, t, -1);
        assert_eq!(words(s), w);
    });
}

#[test]
fn response_fields_round_trip_through_the_cli_the_store_and_an_import() {
    for st in stores("response_cli") {
        let s = st.url.as_str();
        add_strategy(
            s,
            "login",
            "fixed_window",
            "3",
            &[
                "--per",
                "day",
                "--match",
                "api=/login",
                "--each",
                "ip",
                "--count-if",
                "status=403, 401,5xx",
                "--cost-after",
                "upcost",
            ],
        );
        let r = &rows(s)[0];
        assert_eq!(r["count_if"], "401,403,5xx", "canonical: {r}");
        assert_eq!(r["cost_after"], "upcost");
        assert!(r.get("cost_from").is_none(), "{r}");
        let list = ok(&["strategy", "list", "--store", s]);
        assert!(
            list.contains("count_if=status=401,403,5xx cost_after=upcost"),
            "{list}"
        );
        let id = r["id"].to_string();
        cli::update_strategy(s, &id, &["--count-if", "4xx", "--cost-after", ""]);
        let r = &rows(s)[0];
        assert_eq!(r["count_if"], "4xx");
        assert!(
            r.get("cost_after").is_none(),
            "an empty value removes it: {r}"
        );
        reimport(s, &id, r#""count_if":"4xx""#);
        assert_eq!(rows(s)[0]["count_if"], "4xx");
    }
}

#[test]
fn bad_response_arguments_name_the_flag_and_store_nothing() {
    let st = cli::sqlite_store();
    let s = st.url.as_str();
    for (extra, flag) in [
        (
            &["--algorithm", "fixed_window", "--count-if", "status=401,"][..],
            "--count-if",
        ),
        (
            &["--algorithm", "fixed_window", "--count-if", "6xx"][..],
            "--count-if",
        ),
        (
            &["--algorithm", "concurrency", "--count-if", "401"][..],
            "--count-if",
        ),
        (
            &["--algorithm", "fixed_window", "--cost-from", "Cost"][..],
            "--cost-from",
        ),
        (
            &["--algorithm", "concurrency", "--cost-after", "upcost"][..],
            "--cost-after",
        ),
    ] {
        add_refused(s, extra, flag);
    }
    assert!(rows(s).is_empty());
}

#[test]
fn the_api_takes_and_shows_the_response_fields() {
    let st = cli::sqlite_store();
    let srv = serve::Serve::start_temp(&st.url, &[]);
    let body = json!({"name": "gql", "match": {"api": "/gql"}, "algorithm": "token_bucket",
                      "rate": 10, "burst": 100, "cost_from": "cost", "count_if": "2xx"});
    srv.post_strategy(&body);
    let s = &srv.get("/api/v1/strategies")["strategies"][0];
    assert_eq!(
        (&s["cost_from"], &s["count_if"], &s["cost_after"]),
        (&json!("cost"), &json!("2xx"), &Value::Null),
        "{s}"
    );
    for (bad, field) in [
        (json!({"count_if": "abc"}), "count_if"),
        (json!({"cost_after": "X"}), "cost_after"),
        (
            json!({"algorithm": "concurrency", "cost_from": "cost"}),
            "cost_from",
        ),
    ] {
        srv.strategy_refused(&bad, field);
    }
}
