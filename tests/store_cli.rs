//! The `rate-ctl` store commands against a real SQLite file and a real
//! MariaDB server (see tests/support/cli.rs for how the server is found).
#![cfg(feature = "cli")]

#[path = "support/cli.rs"]
mod cli;

use std::time::Instant;

use cli::{
    add_strategy, json_lines, listed as rows, ok, rate_ctl, sql, stores, the_one, version,
    PAY_MATCHES,
};
use serde_json::Value;

#[test]
fn strategy_lifecycle_bumps_the_version_on_every_change() {
    for st in stores("strategy_lifecycle") {
        let s = st.url.as_str();
        ok(&["strategy", "list", "--store", s]); // creates and migrates
        let v0 = version(s);
        // Plain `add` prints just the new id.
        let id: u32 = add_strategy(
            s,
            "pay-u1024",
            "token_bucket",
            "100",
            &[&PAY_MATCHES[..], &["--per", "second", "--burst", "20"]].concat(),
        )
        .trim()
        .parse()
        .expect("add prints the id");
        assert!(id > 0, "{}", st.label);
        let v1 = version(s);
        assert!(v1 > v0, "{}: add bumps the version", st.label);

        let list = rows("strategy", s);
        let r = the_one(&list);
        assert_eq!(r["id"], id);
        assert_eq!(r["match"]["ip"], "1.2.3.4", "ip stored canonical");
        assert_eq!(r["match"]["userid"], "u1024");
        assert_eq!(r["algorithm"], "token_bucket");
        assert_eq!(r["rate"], 100);
        assert_eq!(r["burst"], 20);
        assert_eq!(r["scope"], "cluster");
        assert_eq!(r["enabled"], true);

        let upd: Value = serde_json::from_str(&ok(&[
            "strategy",
            "update",
            "--store",
            s,
            &id.to_string(),
            "--rate",
            "50",
            "--disable",
            "--scope",
            "host",
            "--json",
        ]))
        .unwrap();
        assert_eq!(upd["version"].as_i64().unwrap(), version(s));
        assert!(version(s) > v1);
        let r = &rows("strategy", s)[0];
        assert_eq!(
            (r["rate"].as_u64(), r["enabled"].as_bool()),
            (Some(50), Some(false))
        );
        assert_eq!(r["scope"], "host");
        assert_eq!(
            r["match"]["api"], "/pay",
            "update keeps conditions not given"
        );

        // Filters.
        let second = add_strategy(
            s,
            "other",
            "fixed_window",
            "10",
            &["--match", "api=/login", "--per", "minute"],
        );
        assert_eq!(
            json_lines(&ok(&[
                "strategy",
                "list",
                "--store",
                s,
                "--json",
                "--match",
                "api=/login"
            ]))
            .len(),
            1
        );
        assert_eq!(
            json_lines(&ok(&[
                "strategy", "list", "--store", s, "--json", "--name", "pay"
            ]))
            .len(),
            1
        );
        let human = ok(&["strategy", "list", "--store", s]);
        assert!(
            human.contains("pay-u1024") && human.contains("api=/login"),
            "{human}"
        );

        let v2 = version(s);
        ok(&["strategy", "rm", "--store", s, second.trim()]);
        assert!(version(s) > v2);
        assert_eq!(rows("strategy", s).len(), 1);

        // Unknown id: non-zero, named, nothing bumped.
        let v3 = version(s);
        let o = rate_ctl(&["strategy", "rm", "--store", s, "999999"]);
        assert!(!o.status.success());
        assert!(String::from_utf8_lossy(&o.stderr).contains("999999"));
        assert_eq!(
            version(s),
            v3,
            "{}: a failed change bumps nothing",
            st.label
        );
    }
}

#[test]
fn bad_arguments_name_the_argument_and_write_nothing() {
    for st in stores("bad_arguments") {
        let s = st.url.as_str();
        add_strategy(s, "taken", "token_bucket", "1", &[]);
        let v = version(s);
        // Each case: the `strategy add` arguments (split on spaces; "''" is
        // an empty argument) and the flag the error must name. Most vary one
        // flag on a valid token_bucket (`tb`) or warm_up (`wu`) base.
        let tb = |extra: &str| format!("--name a --algorithm token_bucket --rate 5 {extra}");
        let wu = |extra: &str| format!("--name a --algorithm warm_up --rate 5 {extra}");
        let cases: Vec<(String, &str)> = vec![
            (
                "--name a --algorithm token_bucket --rate 0".into(),
                "--rate",
            ),
            (tb("--match ip=1.2.3"), "--match"),
            (tb("--match User=x"), "--match"),
            (tb("--match novalue"), "--match"),
            (
                "--name a --algorithm tokenbucket --rate 5".into(),
                "--algorithm",
            ),
            (tb("--burst 0"), "--burst"),
            (tb("--per week"), "--per"),
            (tb("--status 200"), "--status"),
            (
                "--name a --algorithm fixed_window --rate 5 --action delay --max-delay-ms 10"
                    .into(),
                "--action",
            ),
            (tb("--action delay"), "--max-delay-ms"),
            (tb("--scope galaxy"), "--scope"),
            (
                "--name '' --algorithm token_bucket --rate 5".into(),
                "--name",
            ),
            (
                "--name taken --algorithm token_bucket --rate 5".into(),
                "--name",
            ),
            (
                "--name a --algorithm token_bucket --rate -3".into(),
                "--rate",
            ),
            ("--name a --algorithm warm_up --rate 5".into(), "--warm-up"),
            (wu("--warm-up 500ms"), "--warm-up"),
            (wu("--warm-up 2h"), "--warm-up"),
            (wu("--warm-up 30s --cold-factor 11"), "--cold-factor"),
            (tb("--warm-up 30s"), "--warm-up"),
            // Issue 14: networks, priorities, allow.
            (tb("--match ip=10.0.0.1/8"), "--match"),
            (tb("--match ip=10.0.0.0/33"), "--match"),
            (tb("--priority 1001"), "--priority"),
            (tb("--priority -1001"), "--priority"),
            ("--name a --action allow --rate 5".into(), "--rate"),
            (
                "--name a --action allow --algorithm fixed_window".into(),
                "--algorithm",
            ),
            ("--name a --action allow --status 429".into(), "--status"),
            ("--name a --algorithm token_bucket".into(), "--rate"),
            ("--name a --rate 5".into(), "--algorithm"),
        ];
        for (line, flag) in &cases {
            let args: Vec<&str> = line
                .split(' ')
                .map(|a| if a == "''" { "" } else { a })
                .collect();
            let mut full = vec!["strategy", "add", "--store", s];
            full.extend_from_slice(&args);
            let o = rate_ctl(&full);
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(!o.status.success(), "{}: {args:?} should fail", st.label);
            assert!(
                err.contains(flag),
                "{}: {args:?}: {err:?} should name {flag}",
                st.label
            );
            assert!(o.stdout.is_empty(), "no id printed for {args:?}");
        }
        let o = rate_ctl(&blacklist_add(s, "ip", "999.1.1.1", &[]));
        assert!(!o.status.success());
        assert!(String::from_utf8_lossy(&o.stderr).contains("--value"));
        let o = rate_ctl(&["host", "set-weight", "--store", s, "h", "0"]);
        assert!(!o.status.success());
        assert!(String::from_utf8_lossy(&o.stderr).contains("WEIGHT"));
        assert_eq!(version(s), v, "{}: nothing written", st.label);
        assert_eq!(rows("strategy", s).len(), 1);
    }
}

#[test]
fn export_import_round_trip_is_all_or_nothing_and_fast() {
    for st in stores("export_import") {
        let s = st.url.as_str();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("s.jsonl");
        let mut text = String::new();
        for i in 0..10_000 {
            text.push_str(&format!(
                "{{\"name\":\"s{i}\",\"match\":{{\"userid\":\"u{i}\",\"api\":\"/pay\"}},\
                 \"algorithm\":\"token_bucket\",\"rate\":{},\"burst\":20}}\n",
                100 + i
            ));
        }
        std::fs::write(&file, &text).unwrap();
        let t = Instant::now();
        let out: Value = serde_json::from_str(&ok(&[
            "strategy",
            "import",
            "--store",
            s,
            file.to_str().unwrap(),
            "--json",
        ]))
        .unwrap();
        let took = t.elapsed();
        println!("{}: imported 10,000 strategies in {:?}", st.label, took);
        assert_eq!(out["imported"], 10_000);
        assert!(
            took.as_secs_f64() < 10.0,
            "{}: import took {took:?}",
            st.label
        );

        let exported = dir.path().join("e.jsonl");
        ok(&[
            "strategy",
            "export",
            "--store",
            s,
            exported.to_str().unwrap(),
        ]);
        let lines = json_lines(&std::fs::read_to_string(&exported).unwrap());
        assert_eq!(lines.len(), 10_000);
        assert_eq!(lines[42]["match"]["userid"], "u42");

        // Re-importing the export into the same store replaces by id.
        ok(&[
            "strategy",
            "import",
            "--store",
            s,
            exported.to_str().unwrap(),
        ]);
        assert_eq!(rows("strategy", s).len(), 10_000);

        // A bad third line: nothing written, line 3 named.
        let v = version(s);
        let bad = dir.path().join("bad.jsonl");
        std::fs::write(
            &bad,
            "{\"name\":\"n1\",\"algorithm\":\"token_bucket\",\"rate\":1}\n\
             {\"name\":\"n2\",\"algorithm\":\"token_bucket\",\"rate\":1}\n\
             {\"name\":\"n3\",\"algorithm\":\"token_bucket\",\"rate\":0}\n\
             {\"name\":\"n4\",\"algorithm\":\"token_bucket\",\"rate\":1}\n",
        )
        .unwrap();
        for (content, what) in [
            (None, "rate"),
            (Some("{\"name\":\"n1\",\"algorithm\":\"token_bucket\",\"rate\":1}\n\n{\"name\":\"n2\"\n"), "line 3"),
            (Some("{\"name\":\"n1\",\"algorithm\":\"token_bucket\",\"rate\":1}\n{\"name\":\"x\",\"algorithm\":\"token_bucket\",\"rate\":1}\n{\"name\":\"n1\",\"algorithm\":\"token_bucket\",\"rate\":1}\n"), "name"),
            (Some("{\"name\":\"n1\",\"algorithm\":\"token_bucket\",\"rate\":1}\n{\"name\":\"x\",\"algorithm\":\"token_bucket\",\"rate\":1}\n{\"name\":\"s7\",\"algorithm\":\"token_bucket\",\"rate\":1}\n"), "already exists"),
        ] {
            if let Some(c) = content {
                std::fs::write(&bad, c).unwrap();
            }
            let o = rate_ctl(&["strategy", "import", "--store", s, bad.to_str().unwrap()]);
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(!o.status.success(), "{}: bad import must fail", st.label);
            assert!(err.contains("line 3"), "{}: {err}", st.label);
            assert!(err.contains(what), "{}: {err} should mention {what}", st.label);
            assert_eq!(version(s), v, "{}: nothing written", st.label);
        }
        let names: Vec<Value> = json_lines(&ok(&[
            "strategy", "list", "--store", s, "--json", "--name", "n1",
        ]));
        assert!(names.is_empty());

        // --replace drops what the file does not name.
        let small = dir.path().join("small.jsonl");
        std::fs::write(
            &small,
            "{\"name\":\"only\",\"algorithm\":\"leaky_bucket\",\"rate\":5}\n",
        )
        .unwrap();
        ok(&[
            "strategy",
            "import",
            "--store",
            s,
            small.to_str().unwrap(),
            "--replace",
        ]);
        let all = rows("strategy", s);
        assert_eq!(the_one(&all)["name"], "only");
    }
}

/// `strategy update ID --store STORE` and `extra`; must succeed.
fn update_strategy(store: &str, id: &str, extra: &[&str]) -> String {
    ok(&[&["strategy", "update", id, "--store", store][..], extra].concat())
}

/// `blacklist add --store STORE --dimension DIM --value VALUE` and `extra`.
fn blacklist_add<'a>(
    store: &'a str,
    dim: &'a str,
    value: &'a str,
    extra: &[&'a str],
) -> Vec<&'a str> {
    let args = [
        "blacklist",
        "add",
        "--store",
        store,
        "--dimension",
        dim,
        "--value",
        value,
    ];
    [&args[..], extra].concat()
}

#[test]
fn blacklist_and_hosts() {
    for st in stores("blacklist_and_hosts") {
        let s = st.url.as_str();
        let id = ok(&blacklist_add(
            s,
            "ip",
            "::ffff:10.0.0.1",
            &["--expires", "1h", "--reason", "scraper"],
        ));
        ok(&blacklist_add(s, "userid", "u666", &[]));
        let list = rows("blacklist", s);
        assert_eq!(list.len(), 2);
        assert_eq!(list[0]["value"], "10.0.0.1");
        assert_eq!(list[0]["reason"], "scraper");
        assert!(list[0]["expires_ms"].as_u64().unwrap() > list[0]["created_ms"].as_u64().unwrap());
        assert!(list[1]["expires_ms"].is_null());
        let v = version(s);
        ok(&["blacklist", "rm", "--store", s, id.trim()]);
        assert!(version(s) > v);
        assert_eq!(rows("blacklist", s).len(), 1);

        let v = version(s);
        ok(&["host", "set-weight", "--store", s, "edge-1", "3"]);
        assert!(
            version(s) > v,
            "a weight change re-splits rates: it bumps the version"
        );
        ok(&["host", "set-weight", "--store", s, "edge-1", "2"]);
        let hosts = rows("host", s);
        assert_eq!(the_one(&hosts)["host_id"], "edge-1");
        assert_eq!(hosts[0]["weight"], 2);
        assert_eq!(hosts[0]["fresh"], false, "never heartbeated");
    }
}

#[test]
fn concurrent_writers_each_get_their_own_version() {
    for st in stores("concurrent_writers") {
        let s = st.url.clone();
        // No pre-created schema: eight processes create and migrate the
        // store at once, then each adds one strategy.
        let v0 = 1;
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let s = s.clone();
                std::thread::spawn(move || {
                    let out = add_strategy(&s, &format!("c{i}"), "token_bucket", "7", &["--json"]);
                    serde_json::from_str::<Value>(&out).unwrap()["version"]
                        .as_i64()
                        .unwrap()
                })
            })
            .collect();
        let mut versions: Vec<i64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        versions.sort();
        versions.dedup();
        assert_eq!(
            versions.len(),
            8,
            "{}: each change its own version",
            st.label
        );
        assert_eq!(version(&s), v0 + 8);
    }
}

#[test]
fn rows_broken_in_the_database_are_reported_not_fatal() {
    for st in stores("broken_rows") {
        let s = st.url.as_str();
        add_strategy(s, "good", "token_bucket", "9", &[]);
        add_strategy(s, "bad", "token_bucket", "9", &[]);
        sql(s, "UPDATE strategies SET rate = 0 WHERE name = 'bad'");
        let o = rate_ctl(&["strategy", "list", "--store", s, "--json"]);
        assert!(o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("rate: must be greater than 0"), "{err}");
        let list = json_lines(&String::from_utf8_lossy(&o.stdout));
        assert_eq!(the_one(&list)["name"], "good");
    }
}

#[test]
fn dry_run_from_the_cli_keeps_the_action_it_ends_with() {
    for st in stores("dry_run_cli") {
        let s = st.url.as_str();
        let add = |name: &str, extra: &[&str]| -> String {
            let mut args = vec![
                "strategy", "add", "--store", s, "--name", name, "--match", "api=/q",
            ];
            args.extend_from_slice(extra);
            ok(&args).trim().to_string()
        };
        let delay = add(
            "queue",
            &[
                "--algorithm",
                "leaky_bucket",
                "--rate",
                "10",
                "--action",
                "delay",
                "--max-delay-ms",
                "500",
            ],
        );
        let reject = add(
            "pay",
            &[
                "--algorithm",
                "fixed_window",
                "--rate",
                "10",
                "--status",
                "429",
            ],
        );
        let row = |id: &str| -> Value {
            rows("strategy", s)
                .into_iter()
                .find(|r| r["id"].as_u64() == id.parse().ok())
                .unwrap()
        };
        for id in [&delay, &reject] {
            ok(&[
                "strategy", "update", "--store", s, id, "--action", "dry_run",
            ]);
        }
        // (action, kept field, value) of the delay and the reject strategy.
        let expect = |delay_action: &str, reject_action: &str| {
            let (d, r) = (row(&delay), row(&reject));
            assert_eq!(
                (&d["action"], &d["max_delay_ms"], &r["action"], &r["status"]),
                (
                    &Value::from(delay_action),
                    &Value::from(500),
                    &Value::from(reject_action),
                    &Value::from(429)
                ),
                "{}",
                st.label
            );
        };
        expect("dry_run", "dry_run");
        // Back to enforcing: the kept cap and status come back.
        ok(&[
            "strategy", "update", "--store", s, &delay, "--action", "delay",
        ]);
        ok(&[
            "strategy", "update", "--store", s, &reject, "--action", "reject",
        ]);
        expect("delay", "reject");
    }
}

/// `--algorithm warm_up --warm-up 30s`: stored with the default cold factor,
/// listed, exported and imported again with its fields.
#[test]
fn warm_up_from_the_cli_round_trips_through_export_and_import() {
    for st in stores("warm_up_cli") {
        let s = st.url.as_str();
        ok(&[
            "strategy",
            "add",
            "--store",
            s,
            "--name",
            "search",
            "--match",
            "api=/search",
            "--algorithm",
            "warm_up",
            "--rate",
            "500",
            "--warm-up",
            "30s",
        ]);
        let r = &rows("strategy", s)[0];
        assert_eq!(r["algorithm"], "warm_up");
        assert_eq!(r["warm_up_ms"], 30_000);
        assert_eq!(r["cold_factor"], 3);
        let id = r["id"].to_string();
        update_strategy(s, &id, &["--cold-factor", "5"]);
        assert_eq!(rows("strategy", s)[0]["cold_factor"], 5);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("export.jsonl");
        let file = file.to_str().unwrap();
        ok(&["strategy", "export", "--store", s, file]);
        let exported = std::fs::read_to_string(file).unwrap();
        assert!(exported.contains("\"warm_up_ms\":30000"), "{exported}");
        ok(&["strategy", "rm", &id, "--store", s]);
        ok(&["strategy", "import", "--store", s, file]);
        let r = &rows("strategy", s)[0];
        assert_eq!(
            (r["warm_up_ms"].clone(), r["cold_factor"].clone()),
            (30_000.into(), 5.into())
        );
        // Switching to another algorithm drops the warm-up fields.
        let id = r["id"].to_string();
        update_strategy(s, &id, &["--algorithm", "leaky_bucket"]);
        let r = &rows("strategy", s)[0];
        assert!(
            r.get("warm_up_ms").is_none() && r.get("cold_factor").is_none(),
            "{r}"
        );
    }
}

#[test]
fn ranges_allow_and_priority_from_the_cli() {
    for st in stores("ranges_cli") {
        let s = st.url.as_str();
        let add = |args: &[&str]| {
            let mut full = vec!["strategy", "add", "--store", s];
            full.extend_from_slice(args);
            ok(&full)
        };
        add(&[
            "--name",
            "clients",
            "--match",
            "ip=::ffff:10.0.0.0/104",
            "--algorithm",
            "token_bucket",
            "--rate",
            "10",
        ]);
        add(&[
            "--name",
            "office",
            "--match",
            "ip=198.51.100.0/24",
            "--action",
            "allow",
        ]);
        add(&[
            "--name",
            "vip",
            "--match",
            "userid=vip",
            "--algorithm",
            "token_bucket",
            "--rate",
            "1000",
            "--priority",
            "10",
        ]);
        let list = rows("strategy", s);
        let by = |n: &str| list.iter().find(|r| r["name"] == n).unwrap().clone();
        assert_eq!(
            by("clients")["match"]["ip"],
            "10.0.0.0/8",
            "{}: canonical network",
            st.label
        );
        assert_eq!(by("clients")["priority"], 0);
        assert_eq!(by("office")["action"], "allow");
        assert_eq!(by("office")["match"]["ip"], "198.51.100.0/24");
        assert_eq!(by("vip")["priority"], 10);
        // The text listing says allow, and the priority.
        let text = ok(&["strategy", "list", "--store", s]);
        assert!(
            text.lines()
                .any(|l| l.contains("office") && l.contains("allow")),
            "{text}"
        );
        assert!(text.lines().next().unwrap().contains(" PRIO "), "{text}");
        let vip_line = text.lines().find(|l| l.contains("vip")).unwrap();
        assert!(vip_line.contains(" 10 userid=vip"), "{text}");
        // update --priority; a bad prefix names the value's network.
        let id = by("vip")["id"].to_string();
        ok(&["strategy", "update", &id, "--store", s, "--priority", "-5"]);
        assert_eq!(
            rows("strategy", s)
                .iter()
                .find(|r| r["name"] == "vip")
                .unwrap()["priority"],
            -5
        );
        // `rate-ctl CMD --store S`, CMD split on spaces.
        let run = |cmd: &str| {
            let mut args: Vec<&str> = cmd.split(' ').collect();
            args.extend(["--store", s]);
            rate_ctl(&args)
        };
        // A refusal names the flag and the network the value would be.
        let refused = |cmd: &str, flag: &str, network: &str| {
            let o = run(cmd);
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(!o.status.success(), "{cmd}");
            assert!(err.contains(flag) && err.contains(network), "{err}");
        };
        refused(
            &format!("strategy update {id} --match ip=10.0.0.1/8"),
            "--match",
            "10.0.0.0/8",
        );
        // Export / import keeps priority and allow.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("export.jsonl");
        let file = file.to_str().unwrap();
        ok(&["strategy", "export", "--store", s, file]);
        let exported = std::fs::read_to_string(file).unwrap();
        assert!(
            exported.contains("\"priority\":-5") && exported.contains("\"action\":\"allow\""),
            "{exported}"
        );
        // Versions and times move on import; compare what the operator wrote.
        let written = |rows: Vec<Value>| -> Vec<Value> {
            rows.into_iter()
                .map(|mut r| {
                    for k in ["version", "created_ms", "updated_ms"] {
                        r.as_object_mut().unwrap().remove(k);
                    }
                    r
                })
                .collect()
        };
        let before = written(rows("strategy", s));
        ok(&["strategy", "import", "--store", s, "--replace", file]);
        assert_eq!(written(rows("strategy", s)), before, "{}", st.label);
        // Blacklist networks.
        let o = run("blacklist add --dimension ip --value 203.0.113.0/24 --expires 1h");
        assert!(o.status.success(), "{o:?}");
        let bl = rows("blacklist", s);
        assert_eq!(bl[0]["value"], "203.0.113.0/24");
        refused(
            "blacklist add --dimension ip --value 203.0.113.9/24",
            "--value",
            "203.0.113.0/24",
        );
    }
}
