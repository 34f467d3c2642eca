//! Embeds the admin page: every file directly under `web/` becomes an entry
//! of `$OUT_DIR/web_assets.rs` (name, content type, bytes via include_bytes!),
//! served by `rate-ctl serve` at `/` and `/<name>`.

use std::fmt::Write as _;
use std::path::Path;

fn main() {
    if std::env::var_os("CARGO_FEATURE_CLI").is_none() {
        return;
    }
    let root = std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo");
    let web = Path::new(&root).join("web");
    println!("cargo:rerun-if-changed={}", web.display());
    let mut files: Vec<_> = std::fs::read_dir(&web)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.is_file())
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    let mut out = String::from("/// (file name, content type, bytes) of every file under web/.\n");
    out.push_str("pub static WEB_ASSETS: &[(&str, &str, &[u8])] = &[\n");
    for p in &files {
        println!("cargo:rerun-if-changed={}", p.display());
        let name = p
            .file_name()
            .and_then(|n| n.to_str())
            .expect("UTF-8 file name");
        let ctype = match p.extension().and_then(|e| e.to_str()) {
            Some("html") => "text/html; charset=utf-8",
            Some("js") => "text/javascript; charset=utf-8",
            Some("css") => "text/css; charset=utf-8",
            Some("svg") => "image/svg+xml",
            Some("png") => "image/png",
            Some("ico") => "image/x-icon",
            Some("json") => "application/json",
            _ => "application/octet-stream",
        };
        writeln!(
            out,
            "    ({name:?}, {ctype:?}, include_bytes!({:?})),",
            p.display().to_string()
        )
        .expect("string write");
    }
    out.push_str("];\n");
    let dest = Path::new(&std::env::var("OUT_DIR").expect("set by cargo")).join("web_assets.rs");
    std::fs::write(dest, out).expect("write web_assets.rs");
}
