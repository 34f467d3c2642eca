//! The `rate-ctl` config commands against a running `rate-ctl serve`
//! (`--api URL --token T`): same output as `--store` on the same store, same
//! messages and exit codes for bad arguments with nothing written, a refused
//! token, and an all-or-nothing import that names the bad line.
#![cfg(feature = "cli")]

#[path = "support/cli.rs"]
mod cli;
#[path = "support/serve.rs"]
mod serve;

use cli::{json_lines, ok, rate_ctl, rate_ctl_env, sqlite_store, version, TestStore, PAY_MATCHES};
use serde_json::Value;
use serve::Serve;

/// Runs a command that must fail with `code`; returns stderr.
fn fails(args: &[&str], code: i32) -> String {
    let o = rate_ctl(args);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(o.status.code(), Some(code), "rate-ctl {args:?}: {err}");
    assert!(
        o.stdout.is_empty(),
        "rate-ctl {args:?} printed {:?}",
        o.stdout
    );
    err
}

/// A fresh SQLite store and `rate-ctl serve` on it (token and log in a
/// temporary directory); serve stops first when it is dropped.
struct Setup {
    s: Serve,
    dir: tempfile::TempDir,
    st: TestStore,
}

impl Setup {
    fn start() -> Setup {
        let st = sqlite_store();
        let dir = tempfile::tempdir().unwrap();
        let s = Serve::start_in(&st.url, dir.path(), &[]);
        Setup { s, dir, st }
    }
}

/// `rate-ctl ARGS` through the API and through the store.
struct Both<'a> {
    api: Vec<&'a str>,
    store: Vec<&'a str>,
}

impl<'a> Both<'a> {
    fn new(s: &'a Serve, url: &'a str, store: &'a str) -> Both<'a> {
        Both {
            api: vec!["--api", url, "--token", s.token.as_str()],
            store: vec!["--store", store],
        }
    }
    fn api(&self, args: &[&'a str]) -> Vec<&'a str> {
        args.iter().chain(&self.api).copied().collect()
    }
    fn store(&self, args: &[&'a str]) -> Vec<&'a str> {
        args.iter().chain(&self.store).copied().collect()
    }
    /// Runs `args` both ways and asserts the same stdout; returns it.
    fn same(&self, args: &[&'a str]) -> String {
        let a = ok(&self.api(args));
        let s = ok(&self.store(args));
        assert_eq!(a, s, "{args:?}: --api vs --store");
        a
    }
}

#[test]
fn commands_through_the_api_match_the_store() {
    let x = Setup::start();
    let (store, s, url) = (x.st.url.as_str(), &x.s, x.s.url());
    let b = Both::new(s, &url, store);

    // add prints just the id, and the strategy is in the store.
    let v0 = version(store);
    let rest = [
        "--algorithm",
        "token_bucket",
        "--rate",
        "100",
        "--burst",
        "20",
    ];
    let add_pay = [
        &["strategy", "add", "--name", "pay-u1024"][..],
        &PAY_MATCHES,
        &rest,
        &["--status", "429"],
    ]
    .concat();
    let out = ok(&b.api(&add_pay));
    let id: u32 = out.trim().parse().expect("add prints the id");
    assert!(version(store) > v0, "add bumps the version");
    let add2: Value = serde_json::from_str(&ok(&b.api(&[
        "strategy",
        "add",
        "--name",
        "search",
        "--match",
        "api=/search",
        "--algorithm",
        "sliding_window",
        "--rate",
        "600",
        "--per",
        "minute",
        "--scope",
        "host",
        "--json",
    ])))
    .unwrap();
    assert_eq!(add2["version"].as_i64(), Some(version(store)), "{add2}");
    let id2 = add2["id"].as_u64().unwrap();

    // list, --json, filters and export print the same as --store.
    let list = json_lines(&b.same(&["strategy", "list", "--json"]));
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["id"], id);
    assert_eq!(list[0]["match"]["ip"], "1.2.3.4");
    assert_eq!(list[0]["status"], 429);
    let text = b.same(&["strategy", "list"]);
    assert!(
        text.contains("pay-u1024") && text.contains("reject:429"),
        "{text}"
    );
    let only = b.same(&["strategy", "list", "--match", "api=/search"]);
    assert!(
        only.contains("search") && !only.contains("pay-u1024"),
        "{only}"
    );
    b.same(&["strategy", "list", "--name", "pay", "--json"]);
    let export = b.same(&["strategy", "export"]);
    assert_eq!(export.lines().count(), 2);

    // update changes only the given fields.
    let upd: Value = serde_json::from_str(&ok(&b.api(&[
        "strategy",
        "update",
        &id.to_string(),
        "--rate",
        "50",
        "--disable",
        "--json",
    ])))
    .unwrap();
    assert_eq!(upd["id"], id);
    assert_eq!(upd["version"].as_i64(), Some(version(store)));
    let text = ok(&b.api(&["strategy", "update", &id2.to_string(), "--rate", "700"]));
    assert_eq!(
        text.trim(),
        format!("updated strategy {id2} (config version {})", version(store))
    );
    let list = json_lines(&b.same(&["strategy", "list", "--json"]));
    assert_eq!(list[0]["rate"], 50);
    assert_eq!(list[0]["enabled"], false);
    assert_eq!(list[0]["burst"], 20, "untouched");
    assert_eq!(list[0]["match"]["userid"], "u1024", "untouched");
    assert_eq!(list[1]["rate"], 700);

    // Bad arguments: exit 2, the argument named, the same message as with
    // --store, nothing written.
    let id_s = id.to_string();
    let bad: Vec<(Vec<&str>, &str)> = vec![
        // Faster than nginx's millisecond clock can enforce (issue 11 #4):
        // refused with the smallest burst that works.
        (
            vec![
                "strategy",
                "add",
                "--name",
                "fast",
                "--algorithm",
                "token_bucket",
                "--rate",
                "5000",
                "--burst",
                "1",
            ],
            "the smallest burst that works is 5",
        ),
        (
            vec![
                "strategy",
                "add",
                "--name",
                "faster",
                "--algorithm",
                "token_bucket",
                "--rate",
                "1000000",
                "--burst",
                "1",
            ],
            "the smallest burst that works is 1000",
        ),
        (
            vec!["strategy", "update", &id_s, "--rate", "1000000", "--burst", "1"],
            "invalid --burst: burst: 1 at 1000000 per second is shorter than nginx's 1 ms clock tick",
        ),
        (
            vec![
                "strategy",
                "add",
                "--name",
                "x",
                "--algorithm",
                "token_bucket",
                "--rate",
                "0",
            ],
            "invalid --rate: ",
        ),
        (
            vec![
                "strategy",
                "add",
                "--name",
                "search",
                "--algorithm",
                "token_bucket",
                "--rate",
                "1",
            ],
            "invalid --name: ",
        ),
        (
            vec!["strategy", "update", &id_s, "--match", "ip=not-an-ip"],
            "invalid --match: ",
        ),
        (
            vec!["strategy", "update", &id_s, "--name", "search"],
            "invalid --name: ",
        ),
        (
            vec!["strategy", "update", &id_s, "--action", "delay"],
            "invalid --max-delay-ms: ",
        ),
        (
            vec!["blacklist", "add", "--dimension", "ip", "--value", "nope"],
            "invalid --value: ",
        ),
        (vec!["host", "set-weight", "", "2"], "host-id"),
    ];
    for (args, want) in &bad {
        let before = version(store);
        let before_list = ok(&b.store(&["strategy", "list", "--json"]));
        let e_api = fails(&b.api(args), 2);
        assert!(e_api.contains(want), "{args:?}: {e_api}");
        let e_store = fails(&b.store(args), 2);
        assert_eq!(e_api, e_store, "{args:?}: same message both ways");
        assert_eq!(version(store), before, "{args:?}: nothing written");
        assert_eq!(
            ok(&b.store(&["strategy", "list", "--json"])),
            before_list,
            "{args:?}"
        );
    }
    // An unknown id: exit 1, same message, nothing written.
    let before = version(store);
    for args in [
        vec!["strategy", "update", "999", "--rate", "5"],
        vec!["strategy", "rm", "999"],
        vec!["blacklist", "rm", "999"],
    ] {
        let e_api = fails(&b.api(&args), 1);
        // The CLI names its ID argument once ("ID: no strategy 999").
        assert!(
            e_api.contains("ID: no ") && e_api.contains("999"),
            "{e_api}"
        );
        assert_eq!(e_api, fails(&b.store(&args), 1), "{args:?}");
    }
    assert_eq!(version(store), before);

    // Blacklist.
    let bl: u64 = ok(&b.api(&[
        "blacklist",
        "add",
        "--dimension",
        "ip",
        "--value",
        "::ffff:10.0.0.9",
        "--expires",
        "1h",
        "--reason",
        "abuse",
    ]))
    .trim()
    .parse()
    .expect("blacklist add prints the id");
    let entries = json_lines(&b.same(&["blacklist", "list", "--json"]));
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0]["id"], bl);
    assert_eq!(entries[0]["value"], "10.0.0.9");
    assert_eq!(entries[0]["reason"], "abuse");
    assert!(entries[0]["expires_ms"].as_u64().is_some());
    let text = b.same(&["blacklist", "list"]);
    assert!(text.contains("10.0.0.9"), "{text}");
    let rm: Value =
        serde_json::from_str(&ok(&b.api(&["blacklist", "rm", &bl.to_string(), "--json"]))).unwrap();
    assert_eq!(rm["version"].as_i64(), Some(version(store)));
    assert!(b.same(&["blacklist", "list", "--json"]).is_empty());

    // Hosts.
    let out = ok(&b.api(&["host", "set-weight", "web-1", "3"]));
    assert_eq!(
        out.trim(),
        format!("host web-1: weight 3 (config version {})", version(store))
    );
    ok(&b.api(&["host", "set-weight", "web 2/b", "1"]));
    let hosts = json_lines(&b.same(&["host", "list", "--json"]));
    assert_eq!(hosts.len(), 2, "{hosts:?}");
    assert_eq!(hosts[0]["host_id"], "web 2/b", "odd ids survive the URL");
    assert_eq!(hosts[1]["host_id"], "web-1");
    assert_eq!(hosts[1]["weight"], 3);
    b.same(&["host", "list"]);

    // rm, one line per id.
    let out = ok(&b.api(&["strategy", "rm", &id.to_string(), &id2.to_string()]));
    assert_eq!(out.lines().count(), 2, "{out}");
    assert!(out.starts_with(&format!("removed strategy {id} ")), "{out}");
    assert!(b.same(&["strategy", "list", "--json"]).is_empty());

    // API changes are audited under the token's name.
    let audit = s.get("/api/v1/audit?limit=100");
    let entries = audit["entries"].as_array().unwrap();
    assert!(
        entries
            .iter()
            .any(|e| e["action"] == "strategy.create" && e["token"] == "admin"),
        "{audit}"
    );
    assert!(entries.iter().all(|e| e["token"] != "cli"), "{audit}");

    // The environment works like the flags.
    let o = rate_ctl_env(
        &["strategy", "list", "--json"],
        &[("RATE_CTL_API", url.as_str()), ("RATE_CTL_TOKEN", &s.token)],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // --api and --store together are refused, before anything is written.
    let before = version(store);
    let e = fails(
        &api_add(&url, Some(&s.token), "both", "1", &["--store", store]),
        2,
    );
    assert!(e.contains("--store and --api"), "{e}");
    let o = rate_ctl_env(
        &["strategy", "list", "--store", store],
        &[("RATE_CTL_API", url.as_str())],
    );
    assert_eq!(o.status.code(), Some(2), "RATE_CTL_API counts as --api");
    assert_eq!(version(store), before);
}

/// `rate-ctl strategy add --api URL [--token TOKEN] --name NAME
/// --algorithm fixed_window --rate RATE` and `extra`.
fn api_add<'a>(
    url: &'a str,
    token: Option<&'a str>,
    name: &'a str,
    rate: &'a str,
    extra: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec!["strategy", "add", "--api", url];
    if let Some(t) = token {
        args.extend(["--token", t]);
    }
    args.extend([
        "--name",
        name,
        "--algorithm",
        "fixed_window",
        "--rate",
        rate,
    ]);
    args.extend_from_slice(extra);
    args
}

#[test]
fn a_refused_token_is_a_clear_error_and_writes_nothing() {
    let st = sqlite_store();
    let store = st.url.as_str();
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start_with_tokens(store, dir.path(), &["read"]);
    let url = s.url();
    ok(&api_add(&url, Some(&s.token), "a", "5", &[]));
    let before = version(store);
    let add = |token: Option<&str>| fails(&api_add(&url, token, "b", "5", &[]), 1);
    for e in [add(Some("wrong")), add(None)] {
        assert!(e.contains("token was refused"), "{e}");
        assert!(e.contains("--token or RATE_CTL_TOKEN"), "{e}");
    }
    let e = fails(&["strategy", "list", "--api", &url, "--token", "wrong"], 1);
    assert!(e.contains("token was refused"), "{e}");
    // The read token lists but may not change anything.
    let list = ok(&[
        "strategy",
        "list",
        "--api",
        &url,
        "--token",
        "read-secret",
        "--json",
    ]);
    assert_eq!(json_lines(&list).len(), 1);
    let e = add(Some("read-secret"));
    assert!(e.contains("admin token"), "{e}");
    assert_eq!(version(store), before, "nothing written");

    // A server that is not there: exit 1 naming --api.
    drop(s);
    let e = fails(&["strategy", "list", "--api", &url, "--token", "x"], 1);
    assert!(
        e.contains("cannot reach rate-ctl serve") && e.contains(&url),
        "{e}"
    );
}

#[test]
fn import_through_the_api_is_all_or_nothing() {
    let x = Setup::start();
    let (store, s, url) = (x.st.url.as_str(), &x.s, x.s.url());
    let b = Both::new(s, &url, store);
    let dir = &x.dir;
    ok(&b.api(&[
        "strategy",
        "add",
        "--name",
        "keep",
        "--algorithm",
        "fixed_window",
        "--rate",
        "5",
    ]));

    let line = |name: &str, rate: u64| {
        format!(
            r#"{{"name":"{name}","match":{{"api":"/{name}"}},"algorithm":"token_bucket","rate":{rate},"burst":2}}"#
        )
    };
    // Line 3 is valid JSON and a strategy in form, but its rate is 0: only
    // the store's validation (behind the API) refuses it.
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(
        &bad,
        format!(
            "{}\n{}\n{}\n{}\n",
            line("i1", 10),
            line("i2", 20),
            line("i3", 0),
            line("i4", 40)
        ),
    )
    .unwrap();
    // Line 3 is not a strategy at all (unknown field).
    let bad_field = dir.path().join("bad_field.jsonl");
    std::fs::write(
        &bad_field,
        format!("{}\n\n{{\"name\":\"x\",\"algorithm\":\"fixed_window\",\"rate\":1,\"colour\":\"red\"}}\n", line("j1", 1)),
    )
    .unwrap();
    // Line 3 takes a name that exists.
    let dup = dir.path().join("dup.jsonl");
    std::fs::write(&dup, format!("{}\n\n{}\n", line("k1", 1), line("keep", 1))).unwrap();
    for (file, want) in [
        (&bad, "line 3: rate: "),
        (&bad_field, "line 3: unknown field `colour`"),
        (&dup, "line 3: name: "),
    ] {
        let before = version(store);
        let before_list = ok(&b.store(&["strategy", "list", "--json"]));
        let f = file.to_str().unwrap();
        let e_api = fails(&b.api(&["strategy", "import", f]), 2);
        assert!(e_api.contains(&format!("{f}: {want}")), "{e_api}");
        assert_eq!(e_api, fails(&b.store(&["strategy", "import", f]), 2), "{f}");
        assert_eq!(version(store), before, "{f}: nothing imported");
        assert_eq!(ok(&b.store(&["strategy", "list", "--json"])), before_list);
    }

    // A good file imports in one change; export → import --replace round-trips.
    let good = dir.path().join("good.jsonl");
    std::fs::write(&good, format!("{}\n{}\n", line("g1", 10), line("g2", 20))).unwrap();
    let before = version(store);
    let out: Value = serde_json::from_str(&ok(&b.api(&[
        "strategy",
        "import",
        good.to_str().unwrap(),
        "--json",
    ])))
    .unwrap();
    assert_eq!(out["imported"], 2);
    assert_eq!(out["version"].as_i64(), Some(before + 1), "one transaction");
    let names: Vec<Value> = json_lines(&b.same(&["strategy", "list", "--json"]))
        .into_iter()
        .map(|r| r["name"].clone())
        .collect();
    assert_eq!(names, ["keep", "g1", "g2"]);

    let exported = dir.path().join("export.jsonl");
    ok(&b.api(&["strategy", "export", exported.to_str().unwrap()]));
    ok(&b.api(&["strategy", "rm", "1"]));
    let text = ok(&b.api(&[
        "strategy",
        "import",
        exported.to_str().unwrap(),
        "--replace",
    ]));
    assert!(
        text.starts_with("imported 3 strategies (config version "),
        "{text}"
    );
    assert_eq!(
        std::fs::read_to_string(&exported).unwrap().lines().count(),
        json_lines(&b.same(&["strategy", "list", "--json"])).len()
    );
    let list = json_lines(&b.same(&["strategy", "list", "--json"]));
    assert_eq!(list[0]["name"], "keep", "ids kept by the import: {list:?}");
    assert_eq!(list[0]["id"], 1);
}
