//! Calendar windows (issue 33) through the interfaces: the CLI (`--per
//! week|month`, `--tz` on add and update), the store (migration 135) with
//! export/import, and the REST API (`per`, `tz`; refusals naming the
//! field).

#[path = "support/cli.rs"]
mod cli;
#[path = "support/serve.rs"]
mod serve;

use cli::{
    add_refused, add_strategy, reimport, stores, strategy_rows as rows, update_strategy as update,
};
use serde_json::json;

#[test]
fn calendar_fields_round_trip_through_the_cli_and_the_store() {
    for st in stores("calendar_cli") {
        let s = st.url.as_str();
        add_strategy(
            s,
            "plan",
            "fixed_window",
            "100000",
            &["--per", "month", "--tz", "Pacific/Auckland", "--each", "ip"],
        );
        let r = &rows(s)[0];
        assert_eq!(
            (&r["per"], &r["tz"]),
            (&json!("month"), &json!("Pacific/Auckland")),
            "{r}"
        );
        let list = cli::ok(&["strategy", "list", "--store", s]);
        assert!(list.contains("tz=Pacific/Auckland"), "{list}");
        let id = r["id"].to_string();
        // Export, remove, import: the zone comes back.
        reimport(s, &id, r#""tz":"Pacific/Auckland""#);
        let r = &rows(s)[0];
        assert_eq!(r["tz"], "Pacific/Auckland", "{r}");
        let id = r["id"].to_string();
        update(s, &id, &["--per", "week", "--tz", "Europe/Berlin"]);
        let r = &rows(s)[0];
        assert_eq!(
            (&r["per"], &r["tz"]),
            (&json!("week"), &json!("Europe/Berlin")),
            "{r}"
        );
        // Back to UTC.
        update(s, &id, &["--tz", ""]);
        let r = &rows(s)[0];
        assert!(r.get("tz").is_none(), "{r}");
        assert_eq!(r["per"], "week");
    }
}

#[test]
fn bad_calendar_arguments_name_the_flag_and_store_nothing() {
    let st = cli::sqlite_store();
    let s = st.url.as_str();
    for (extra, flag) in [
        (
            &[
                "--algorithm",
                "fixed_window",
                "--per",
                "month",
                "--tz",
                "Mars/Olympus",
            ][..],
            "--tz",
        ),
        (
            &[
                "--algorithm",
                "fixed_window",
                "--per",
                "day",
                "--tz",
                "../../etc/passwd",
            ][..],
            "--tz",
        ),
        (
            &["--algorithm", "token_bucket", "--per", "week"][..],
            "--per",
        ),
        (
            &["--algorithm", "sliding_window", "--per", "month"][..],
            "--per",
        ),
        (
            &[
                "--algorithm",
                "fixed_window",
                "--per",
                "hour",
                "--tz",
                "Europe/Berlin",
            ][..],
            "--tz",
        ),
        (
            &[
                "--algorithm",
                "sliding_window",
                "--per",
                "day",
                "--tz",
                "Europe/Berlin",
            ][..],
            "--tz",
        ),
        (
            &["--algorithm", "fixed_window", "--per", "fortnight"][..],
            "--per",
        ),
    ] {
        add_refused(s, extra, flag);
    }
    assert!(rows(s).is_empty());
}

#[test]
fn the_api_takes_and_shows_the_calendar_fields() {
    let st = cli::sqlite_store();
    let srv = serve::Serve::start_temp(&st.url, &[]);
    let body = json!({"name": "plan", "match": {"api": "/v1"}, "algorithm": "fixed_window",
                      "rate": 1000, "per": "month", "tz": "Pacific/Auckland"});
    srv.post_strategy(&body);
    let body = json!({"name": "weekly", "algorithm": "fixed_window", "rate": 10, "per": "week"});
    srv.post_strategy(&body);
    let list = srv.get("/api/v1/strategies");
    let s = &list["strategies"][0];
    assert_eq!(
        (&s["per"], &s["tz"]),
        (&json!("month"), &json!("Pacific/Auckland")),
        "{s}"
    );
    let s = &list["strategies"][1];
    assert_eq!((&s["per"], &s["tz"]), (&json!("week"), &json!(null)), "{s}");
    for (bad, field) in [
        (
            json!({"algorithm": "fixed_window", "per": "month", "tz": "Mars/Olympus"}),
            "tz",
        ),
        (
            json!({"algorithm": "fixed_window", "per": "day", "tz": 5}),
            "tz",
        ),
        (json!({"per": "month"}), "per"),
        (
            json!({"algorithm": "fixed_window", "per": "minute", "tz": "Europe/Berlin"}),
            "tz",
        ),
        (json!({"algorithm": "fixed_window", "per": "year"}), "per"),
    ] {
        srv.strategy_refused(&bad, field);
    }
    assert_eq!(
        srv.get("/api/v1/strategies")["strategies"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
}
