//! Issue 32, the penalty box: `--ban-after --ban-within --ban-for` through
//! the CLI, the store (migration 132: SQLite, and MariaDB / PostgreSQL when
//! their test servers are named), export/import and the REST API; the
//! refusals name the flag. The request path is `t-nginx/40-penalty-box.t`,
//! the ban table `src/core/bans/tests.rs`, the store's ban entries
//! `src/store/bans.rs`.

#[path = "support/cli.rs"]
mod cli;
#[path = "support/serve.rs"]
mod serve;

use cli::{add_refused, add_strategy, ok, reimport, stores, strategy_rows as rows};

#[test]
fn ban_fields_round_trip_through_the_cli_the_store_and_an_import() {
    for st in stores("penalty_box") {
        let s = st.url.as_str();
        add_strategy(
            s,
            "box",
            "fixed_window",
            "2",
            &[
                "--per",
                "day",
                "--match",
                "api=/b",
                "--each",
                "ip",
                "--ban-after",
                "3",
                "--ban-within",
                "10s",
                "--ban-for",
                "2h",
            ],
        );
        let r = &rows(s)[0];
        assert_eq!(
            (&r["ban_after"], &r["ban_within"], &r["ban_for"]),
            (&3.into(), &10.into(), &7200.into()),
            "{} {r}",
            st.label
        );
        let id = r["id"].to_string();
        cli::update_strategy(s, &id, &["--ban-for", "30"]);
        assert_eq!(rows(s)[0]["ban_for"], 30);
        reimport(s, &id, r#""ban_after":3"#);
        let r = &rows(s)[0];
        assert_eq!((&r["ban_after"], &r["ban_for"]), (&3.into(), &30.into()));
        // A strategy without one keeps none.
        add_strategy(s, "plain", "fixed_window", "2", &["--per", "day"]);
        assert!(rows(s)[1].get("ban_after").is_none(), "{}", rows(s)[1]);
    }
}

#[test]
fn bad_ban_arguments_name_the_flag_and_store_nothing() {
    let st = cli::sqlite_store();
    let s = st.url.as_str();
    let ip = ["--algorithm", "fixed_window", "--each", "ip"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        let mut v = ip.to_vec();
        v.extend_from_slice(extra);
        v
    };
    for (extra, flag) in [
        (
            with(&[
                "--ban-after",
                "0",
                "--ban-within",
                "10s",
                "--ban-for",
                "30s",
            ]),
            "--ban-after",
        ),
        (
            with(&["--ban-after", "3", "--ban-within", "0", "--ban-for", "30s"]),
            "--ban-within",
        ),
        (
            with(&[
                "--ban-after",
                "3",
                "--ban-within",
                "10s",
                "--ban-for",
                "31d",
            ]),
            "--ban-for",
        ),
        (
            with(&["--ban-after", "3", "--ban-within", "10x", "--ban-for", "1m"]),
            "--ban-within",
        ),
        (
            with(&["--ban-after", "3", "--ban-for", "30s"]),
            "ban_within",
        ),
    ] {
        add_refused(s, &extra, flag);
    }
    // Not each ip / userid: the blacklist could not hold the key.
    add_refused(
        s,
        &[
            "--algorithm",
            "fixed_window",
            "--each",
            "api",
            "--ban-after",
            "3",
            "--ban-within",
            "10s",
            "--ban-for",
            "30s",
        ],
        "each ip or each userid",
    );
    add_refused(
        s,
        &[
            "--algorithm",
            "fixed_window",
            "--ban-after",
            "3",
            "--ban-within",
            "10s",
            "--ban-for",
            "30s",
        ],
        "--ban-after",
    );
    assert!(rows(s).is_empty());
    // userid is the blacklist's other dimension.
    add_strategy(
        s,
        "user-box",
        "token_bucket",
        "5",
        &[
            "--each",
            "userid",
            "--ban-after",
            "1",
            "--ban-within",
            "1",
            "--ban-for",
            "30d",
        ],
    );
    assert_eq!(rows(s)[0]["ban_for"], 30 * 86_400);
    let list = ok(&["blacklist", "list", "--store", s]);
    assert!(list.contains("SOURCE"), "{list}");
}

/// `POST /api/v1/hosts/{id}/bans`, the route an agent on serve hands its
/// host's bans to: one `source: ban` entry per key (a second host's ban of
/// the same key is the same entry), a token bound to another host gets
/// 403, a refused field is named, and nothing is stored for a refusal.
#[test]
fn agents_on_serve_hand_bans_over_one_entry_per_key() {
    let (st, dir) = cli::sqlite_and_dir();
    let srv = serve::Serve::start_in(&st.url, dir.path(), &[]);
    let made = |host: &str| {
        let out = ok(&[
            "--store",
            &st.url,
            "token",
            "create",
            "--role",
            "agent",
            "--host",
            host,
            "--name",
            &format!("agent-{host}"),
        ]);
        out.split_whitespace().last().unwrap().to_string()
    };
    let (ta, tb) = (made("a"), made("b"));
    let until = rate_ctl_now_ms() + 60_000;
    let ban = |v: &str| {
        format!(
            r#"{{"dimension":"ip","value":"{v}","expires_ms":{until},"reason":"penalty box: strategy 1","strategy":1}}"#
        )
    };
    let addr = srv.url().trim_start_matches("http://").to_string();
    let post = |token: &str, host: &str, body: &str| {
        serve::http(
            &addr,
            "POST",
            &format!("/api/v1/hosts/{host}/bans"),
            Some(token),
            Some(body),
        )
    };
    let (c, v) = post(&ta, "a", &ban("192.0.2.10"));
    assert_eq!((c, &v["created"]), (200, &serde_json::json!(true)), "{v}");
    let (c, w) = post(&tb, "b", &ban("192.0.2.10"));
    assert_eq!(
        (c, &w["created"], &w["id"]),
        (200, &serde_json::json!(false), &v["id"]),
        "{w}"
    );
    let (c, e) = post(&tb, "a", &ban("192.0.2.11"));
    assert_eq!(c, 403, "{e}");
    for (bad, field) in [
        (
            r#"{"dimension":"method","value":"GET","expires_ms":9999999999999,"strategy":1}"#,
            "dimension",
        ),
        (
            r#"{"dimension":"ip","value":"192.0.2.12","expires_ms":1,"strategy":1}"#,
            "expires_ms",
        ),
        (
            r#"{"dimension":"ip","value":"192.0.2.12","expires_ms":9999999999999}"#,
            "strategy",
        ),
    ] {
        let (c, e) = post(&ta, "a", bad);
        assert_eq!(
            (c, &e["error"]["field"]),
            (422, &serde_json::json!(field)),
            "{bad}: {e}"
        );
    }
    let list = ok(&["blacklist", "list", "--store", &st.url]);
    assert_eq!(list.matches("192.0.2.10").count(), 1, "{list}");
    assert!(
        !list.contains("192.0.2.11") && !list.contains("192.0.2.12"),
        "{list}"
    );
    assert!(list.contains(" ban "), "{list}");
}

fn rate_ctl_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}
