//! HTTPS: `rate-ctl serve --tls-cert/--tls-key` with a CA and a server
//! certificate made by the openssl CLI at test time (no key is committed);
//! the CLI (`--api https://…`) and the agent (`--store https://…`) verify
//! the server against `--ca` / RATE_CTL_CA, and fail on the certificate
//! without it (the test CA is not a system root).
#![cfg(feature = "cli")]

#[path = "support/agent.rs"]
mod agent;
#[path = "support/cli.rs"]
mod cli;
#[path = "support/serve.rs"]
mod serve;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serve::Serve;

fn openssl(dir: &Path, args: &[&str]) {
    let o = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the openssl CLI (Debian package openssl)");
    assert!(
        o.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// ca.pem, server.pem (for IP 127.0.0.1, signed by the CA), server.key.
fn make_certs(dir: &Path) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    let mut a = vec!["req", "-x509"];
    a.extend_from_slice(&ec);
    a.extend_from_slice(&[
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=rate_ctl test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    openssl(dir, &a);
    let mut a = vec!["req"];
    a.extend_from_slice(&ec);
    a.extend_from_slice(&[
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    openssl(dir, &a);
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
         keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ],
    );
}

#[test]
fn https_serve_verified_by_the_ca_refused_without_it() {
    let st = cli::sqlite_store();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    make_certs(d);
    let p = |f: &str| d.join(f).to_str().unwrap().to_string();
    let serve = Serve::start_in(
        &st.url,
        d,
        &[
            "--tls-cert",
            &p("server.pem"),
            "--tls-key",
            &p("server.key"),
        ],
    );
    let token = serve.token.clone();
    let api = format!("https://{}", serve.addr);
    cli::add_strategy(
        &st.url,
        "tls-one",
        "token_bucket",
        "5",
        &["--match", "api=/tls"],
    );

    // With the CA: works (flag, then env).
    let o = cli::rate_ctl(&[
        "--api",
        &api,
        "--ca",
        &p("ca.pem"),
        "--token",
        &token,
        "strategy",
        "list",
    ]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(text.contains("tls-one"), "{text}");
    let o = cli::rate_ctl_env(
        &["--api", &api, "--token", &token, "strategy", "list"],
        &[("RATE_CTL_CA", &p("ca.pem"))],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // Without it: the certificate is refused, nothing is sent.
    let o = cli::command()
        .args(["--api", &api, "--token", &token, "strategy", "list"])
        .env_remove("RATE_CTL_CA")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "an unknown CA must not be accepted");
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    eprintln!("without --ca: {}", err.trim());

    // The agent long-polls over HTTPS.
    let shm = d.join("tls.shm");
    let mut args = vec![
        "--ca".to_string(),
        p("ca.pem"),
        "--token".into(),
        token.clone(),
        "agent".into(),
        "--store".into(),
        api.clone(),
        "--shm".into(),
        shm.to_str().unwrap().into(),
        "--host-id".into(),
        "tls-host".into(),
    ];
    args.extend(agent::SMALL_CAPS.iter().map(|s| s.to_string()));
    let alog = std::fs::File::create(d.join("agent.log")).unwrap();
    let mut ag = cli::command()
        .args(&args)
        .stdout(Stdio::null())
        .stderr(alog)
        .spawn()
        .unwrap();
    let mut r = agent::Reader::open(&shm);
    let t = r.wait_version(1, Duration::from_secs(20));
    let _ = ag.kill();
    let _ = ag.wait();
    drop(serve);
    let t =
        t.unwrap_or_else(|| panic!("{}", std::fs::read_to_string(d.join("agent.log")).unwrap()));
    assert_eq!(t.strategies().len(), 1);
}
