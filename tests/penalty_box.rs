//! Issue 32, the penalty box: `--ban-after --ban-within --ban-for` through
//! the CLI, the store (migration 132: SQLite, and MariaDB / PostgreSQL when
//! their test servers are named), export/import and the REST API; the
//! refusals name the flag. The request path is `t-nginx/40-penalty-box.t`,
//! the ban table `src/core/bans/tests.rs`, the store's ban entries
//! `src/store/bans.rs`.

#[path = "support/cli.rs"]
mod cli;

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
