use super::*;

fn base() -> Strategy {
    let conditions = vec![
        Condition::new("ip", "::ffff:1.2.3.4"),
        Condition::new("userid", "u1024"),
    ];
    Strategy {
        burst: 20,
        ..Strategy::plain(7, conditions, Algorithm::TokenBucket, 100, Unit::Second)
    }
}

/// The reader's IPv4 fast path accepts exactly what std's parser
/// does (canonical text is what std parses and prints alike).
#[test]
fn canonical_ipv4_parses_exactly_what_std_parses() {
    let std_v4 = |b: &[u8]| {
        std::str::from_utf8(b)
            .ok()?
            .parse::<std::net::Ipv4Addr>()
            .ok()
            .map(u32::from)
    };
    let mut cases: Vec<Vec<u8>> = [
        "0.0.0.0",
        "255.255.255.255",
        "10.0.0.1",
        "1.2.3.4",
        "01.2.3.4",
        "1.2.3.04",
        "1.2.3.00",
        "256.1.1.1",
        "1.2.3",
        "1.2.3.4.",
        ".1.2.3.4",
        "1..2.3",
        "1.2.3.4 ",
        " 1.2.3.4",
        "1.2.3.4/8",
        "1.2.3.-4",
        "1.2.3.+4",
        "1000.1.1.1",
        "1.2.3.1000",
        "::1",
        "",
        "1.2.3.4\0",
        "9.99.199.249",
        "0.00.0.0",
    ]
    .iter()
    .map(|c| c.as_bytes().to_vec())
    .collect();
    // Every quad of these octet spellings (valid, leading zeros, too
    // large, too long, empty, stray bytes), and random bytes over the
    // grammar's alphabet.
    let octets = [
        "0", "00", "01", "1", "9", "10", "99", "100", "199", "249", "255", "256", "999", "0000",
        "", "1x",
    ];
    for i in 0..octets.len().pow(4) {
        let o = |k: u32| octets[i / octets.len().pow(k) % octets.len()];
        cases.push(format!("{}.{}.{}.{}", o(0), o(1), o(2), o(3)).into_bytes());
    }
    let alphabet = b"0129.5x";
    let mut rng = crate::core::test_rng::Rng(0x9E37_79B9_7F4A_7C15);
    for _ in 0..100_000 {
        let x = rng.next();
        let mut y = x;
        let v: Vec<u8> = (0..x % 16)
            .map(|_| {
                let b = alphabet[(y % 7) as usize];
                y /= 7;
                b
            })
            .collect();
        cases.push(v);
    }
    for c in &cases {
        assert_eq!(
            parse_canonical_ipv4(c),
            std_v4(c),
            "{:?}",
            String::from_utf8_lossy(c)
        );
    }
    assert!(cases.iter().filter(|c| std_v4(c).is_some()).count() >= 6_561);
}

#[test]
fn ip_networks_are_canonicalised_or_refused_naming_the_value() {
    let mut s = base();
    s.conditions[0].value = b"::ffff:10.0.0.0/104".to_vec();
    s.validate().unwrap();
    assert_eq!(s.conditions[0].value, b"10.0.0.0/8");
    s.check().unwrap();
    s.conditions[0].value = b"10.0.0.1/32".to_vec();
    s.validate().unwrap();
    assert_eq!(s.conditions[0].value, b"10.0.0.1", "a /32 is the address");
    s.conditions[0].value = b"2001:DB8::/32".to_vec();
    assert!(s.check().is_err(), "check() wants the canonical form");
    s.validate().unwrap();
    assert_eq!(s.conditions[0].value, b"2001:db8::/32");
    for (bad, says) in [
        (
            "10.0.0.1/8",
            "host bits are set past the /8 prefix; the network is 10.0.0.0/8",
        ),
        (
            "10.0.0.0/33",
            "prefix length \"33\" is not a number from 0 to 32",
        ),
        ("10.0.0/8", "not an IPv4 or IPv6 address or network"),
    ] {
        s.conditions[0].value = bad.as_bytes().to_vec();
        let e = s.validate().unwrap_err().to_string();
        assert!(e.starts_with("conditions[0].value: "), "{e}");
        assert!(e.contains(bad) && e.contains(says), "{e}");
    }
}

#[test]
fn priority_has_a_range_and_allow_needs_nothing() {
    let mut s = base();
    for p in [MIN_PRIORITY, 0, MAX_PRIORITY] {
        s.priority = p;
        s.validate().unwrap();
    }
    for p in [MIN_PRIORITY - 1, MAX_PRIORITY + 1] {
        s.priority = p;
        let e = s.validate().unwrap_err().to_string();
        assert!(
            e.starts_with("priority: must be between -1000 and 1000"),
            "{e}"
        );
    }
    s.priority = 0;
    s.action = Action::Allow;
    s.validate().unwrap();
    assert!(!s.action.is_dry_run());
    // An allow keeps no per-key state: `each` is refused, naming it
    // (also when the file is read: `check`).
    s.each = super::each::Each::of(&["ip"]);
    let e = s.check().unwrap_err().to_string();
    assert!(
        e.starts_with("each: makes no sense for action allow"),
        "{e}"
    );
}

#[test]
fn valid_strategy_canonicalises_ip() {
    let mut s = base();
    s.validate().unwrap();
    assert_eq!(s.conditions[0].value, b"1.2.3.4");
    let mut s = base();
    s.conditions[0].value = b"0:0:0:0:0:0:0:1".to_vec();
    s.validate().unwrap();
    assert_eq!(s.conditions[0].value, b"::1");
    assert!(s.check().is_ok());
    s.conditions[0].value = b"0::1".to_vec();
    assert!(s.check().is_err(), "check() wants the canonical form");
    assert!(is_canonical_ip(b"10.0.0.1"));
    assert!(!is_canonical_ip(b"::ffff:10.0.0.1"));
    assert!(!is_canonical_ip(b"10.0.0.1 "));
    assert!(!is_canonical_ip(b"10.0.0.01"));
    assert!(is_canonical_ip(b"2001:db8::1"));
    assert!(!is_canonical_ip(b"2001:DB8::1"));
}

#[test]
fn buckets_shorter_than_the_clock_tick_are_refused_with_the_smallest_burst() {
    let mut s = base();
    s.conditions.clear();
    (s.rate, s.burst) = (5_000, 1);
    let e = s.validate().unwrap_err();
    assert!(
        matches!(e, ModelError::BelowClockTick { min_burst: 5, .. }),
        "{e}"
    );
    assert!(e.to_string().starts_with("burst: "), "{e}");
    assert!(
        e.to_string().contains("smallest burst that works is 5"),
        "{e}"
    );
    s.burst = 5;
    s.validate().unwrap();
    (s.rate, s.burst) = (1_000_000, 999);
    assert!(matches!(
        s.validate().unwrap_err(),
        ModelError::BelowClockTick {
            min_burst: 1000,
            ..
        }
    ));
    (s.rate, s.burst) = (1_000, 1);
    s.validate().expect("1 ms interval is one tick");
    s.algorithm = Algorithm::LeakyBucket;
    s.rate = 1_001;
    assert!(s
        .validate()
        .unwrap_err()
        .to_string()
        .contains("use token_bucket"));
    s.action = Action::Delay { max_delay_ms: 1 };
    s.validate().expect("a delay queue spans ticks");
    // A dry run keeping that cap queues the same way.
    s.action = Action::DryRunDelay { max_delay_ms: 1 };
    s.validate().expect("a dry run's delay queue spans ticks");
    // The reader's check accepts what an older writer published.
    s.action = Action::Reject { status: None };
    assert!(s.check().is_ok());
    // Windows count per period (≥ 1 s): no tick rule.
    (s.algorithm, s.rate) = (Algorithm::FixedWindow, 1_000_000);
    s.validate().unwrap();
}

#[test]
fn errors_name_the_field() {
    type Case = (fn(&mut Strategy), &'static str);
    let cases: Vec<Case> = vec![
        (|s| s.id = 0, "id"),
        (|s| s.rate = 0, "rate"),
        (|s| s.rate = 2_000_000, "rate"),
        (|s| s.burst = 0, "burst"),
        (|s| s.burst = MAX_BURST + 1, "burst"),
        (
            |s| s.conditions[1].dimension = "User".into(),
            "conditions[1].dimension",
        ),
        (
            |s| s.conditions[1].dimension = "ip".into(),
            "conditions[1].dimension",
        ),
        (|s| s.conditions[1].value = vec![], "conditions[1].value"),
        (
            |s| s.conditions[1].value = vec![b'x'; 257],
            "conditions[1].value",
        ),
        (
            |s| s.conditions[0].value = b"1.2.3".to_vec(),
            "conditions[0].value",
        ),
        (
            |s| s.action = Action::Reject { status: Some(200) },
            "action.status",
        ),
        (
            |s| s.action = Action::Delay { max_delay_ms: 0 },
            "action.max_delay_ms",
        ),
        (
            |s| {
                s.algorithm = Algorithm::FixedWindow;
                s.action = Action::Delay { max_delay_ms: 10 }
            },
            "action",
        ),
        (
            |s| {
                s.conditions = (0..17)
                    .map(|i| Condition::new(format!("d{i}"), "v"))
                    .collect()
            },
            "conditions",
        ),
        (
            |s| {
                s.per = Unit::Day;
                s.rate = 1;
                s.burst = MAX_BURST
            },
            "burst",
        ),
    ];
    for (mutate, field) in cases {
        let mut s = base();
        mutate(&mut s);
        let err = s.validate().unwrap_err().to_string();
        assert!(err.starts_with(field), "{err:?} should name {field}");
    }
}

#[test]
fn leaky_bucket_is_burst_one_and_windows_allow_large_counts() {
    let mut s = base();
    s.algorithm = Algorithm::LeakyBucket;
    s.burst = 50;
    s.validate().unwrap();
    assert_eq!(s.burst, 1);
    let mut s = base();
    s.algorithm = Algorithm::FixedWindow;
    s.per = Unit::Day;
    s.rate = 4_000_000_000;
    s.validate().unwrap();
    s.rate = u32::MAX as u64;
    assert!(s.validate().is_err());
}

#[test]
fn interval_rounds_up() {
    assert_eq!(interval_ns(3, Unit::Second), 333_333_334);
    assert_eq!(interval_ns(1000, Unit::Second), 1_000_000);
    assert_eq!(interval_ns(0, Unit::Second), u64::MAX);
}

#[test]
fn keywords_parse() {
    assert_eq!(
        "token_bucket".parse::<Algorithm>().unwrap(),
        Algorithm::TokenBucket
    );
    assert_eq!("minutes".parse::<Unit>().unwrap(), Unit::Minute);
    assert_eq!("s".parse::<Unit>().unwrap(), Unit::Second);
    assert!("weekly"
        .parse::<Unit>()
        .unwrap_err()
        .to_string()
        .starts_with("per:"));
}

/// Only a fleet lease publishes a rate of 0, and only for a window:
/// written input refuses it for every algorithm.
#[test]
fn rate_0_only_for_a_leased_window() {
    let mut s = base();
    s.validate().unwrap();
    s.algorithm = Algorithm::FixedWindow;
    s.rate = 0;
    assert_eq!(s.clone().validate(), Err(ModelError::ZeroRate));
    assert!(s.check().is_ok());
    assert_eq!(ValidStrategy::leased(s.clone()).unwrap().rate, 0);
    s.algorithm = Algorithm::SlidingWindow;
    assert!(ValidStrategy::leased(s.clone()).is_ok());
    for a in [Algorithm::TokenBucket, Algorithm::Concurrency] {
        s.algorithm = a;
        assert_eq!(ValidStrategy::leased(s.clone()), Err(ModelError::ZeroRate));
    }
}

#[test]
fn the_per_key_sliding_bound_is_the_key_state_s() {
    // Two homes on purpose: the model's bound (what validation accepts)
    // and the packing's (20 bits of a key's word); they must agree.
    assert_eq!(
        MAX_SLIDING_COUNT,
        crate::core::limiter::sliding_window::MAX_SLIDING_COUNT
    );
}
