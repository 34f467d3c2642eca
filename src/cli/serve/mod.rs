//! `rate-ctl serve`: the REST API (docs/API.md), the admin page and the
//! agents' long-poll, over the config store.
//!
//! Stateless: every piece of state is in the store, so several instances
//! may serve one MariaDB. Each instance polls the one-row config version
//! every [`VERSION_POLL`] in one task and shares the result with every
//! waiting long-poll through a watch channel (changes made by this instance
//! are announced at once).

pub mod api;
pub mod auth;
pub mod client;
pub mod openapi;
pub mod source;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, MethodRouter};
use axum::Router;
use clap::Args;
use tokio::sync::watch;
use tracing::{info, warn};

use super::record::parse_duration_ms;
use super::store::{redact_url, Store};
use auth::Tokens;

include!(concat!(env!("OUT_DIR"), "/web_assets.rs"));

/// How often each instance reads the config version for its long-polls.
pub const VERSION_POLL: Duration = Duration::from_millis(150);
/// Largest body of `POST /api/v1/strategies/import`.
pub const IMPORT_BODY_LIMIT: usize = 64 << 20;
/// Longest hold of `GET /api/v1/snapshot?after=V`.
pub const LONG_POLL: Duration = Duration::from_secs(30);

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on (port 0: any free port; the address is printed).
    #[arg(long, default_value = "127.0.0.1:9090", value_name = "ADDR")]
    listen: String,
    /// File holding the admin token; created (mode 0600) with a random token
    /// if missing. Default: admin.token next to an SQLite store, else
    /// /var/lib/rate-ctl/admin.token. Env RATE_CTL_ADMIN_TOKEN overrides.
    #[arg(long, value_name = "FILE")]
    admin_token_file: Option<PathBuf>,
    /// File holding a read-only token (GET endpoints). Env RATE_CTL_READ_TOKEN.
    #[arg(long, value_name = "FILE")]
    read_token_file: Option<PathBuf>,
    /// File holding the agents' token (snapshot and report only).
    /// Env RATE_CTL_AGENT_TOKEN.
    #[arg(long, value_name = "FILE")]
    agent_token_file: Option<PathBuf>,
    /// A host counts as fresh while its heartbeat is at most this old.
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = parse_duration_ms)]
    freshness: u64,
    /// Print the API routes (METHOD PATH per line) and exit.
    #[arg(long, hide = true)]
    list_routes: bool,
}

/// What every handler sees.
pub struct AppState {
    pub store: Store,
    pub tokens: Tokens,
    pub version: watch::Receiver<u64>,
    version_tx: watch::Sender<u64>,
    pub freshness_ms: u64,
}

impl AppState {
    /// Announces a version this instance just committed to its long-polls.
    pub fn announce(&self, v: u64) {
        self.version_tx.send_if_modified(|cur| {
            if v > *cur {
                *cur = v;
                true
            } else {
                false
            }
        });
    }
}

pub type Shared = Arc<AppState>;

/// The router and the list of API routes it serves (method, path).
struct Routes {
    router: Router<Shared>,
    list: Vec<(&'static str, &'static str)>,
}

impl Routes {
    fn add(
        mut self,
        path: &'static str,
        methods: &[&'static str],
        h: MethodRouter<Shared>,
    ) -> Routes {
        for m in methods {
            self.list.push((m, path));
        }
        self.router = self.router.route(path, h);
        self
    }
}

fn routes() -> Routes {
    use api::*;
    use axum::routing::{delete, post, put};
    Routes {
        router: Router::new(),
        list: Vec::new(),
    }
    .add("/api/v1/health", &["GET"], get(health))
    .add("/api/v1/version", &["GET"], get(version))
    .add(
        "/api/v1/strategies",
        &["GET", "POST"],
        get(list_strategies).post(create_strategy),
    )
    .add(
        "/api/v1/strategies/import",
        &["POST"],
        // 10,000 strategies of JSON lines are about 2.5 MB, more than
        // axum's default limit.
        post(import_strategies).layer(axum::extract::DefaultBodyLimit::max(IMPORT_BODY_LIMIT)),
    )
    .add(
        "/api/v1/strategies/{id}",
        &["GET", "PUT", "PATCH", "DELETE"],
        get(get_strategy)
            .put(put_strategy)
            .patch(patch_strategy)
            .delete(delete_strategy),
    )
    .add(
        "/api/v1/blacklist",
        &["GET", "POST"],
        get(list_blacklist).post(add_blacklist),
    )
    .add("/api/v1/blacklist/{id}", &["DELETE"], delete(rm_blacklist))
    .add("/api/v1/hosts", &["GET"], get(list_hosts))
    .add("/api/v1/hosts/{host_id}", &["PUT"], put(set_host_weight))
    .add("/api/v1/hosts/{host_id}/report", &["POST"], post(report))
    .add("/api/v1/audit", &["GET"], get(audit))
    .add("/api/v1/snapshot", &["GET"], get(snapshot))
    .add("/api/v1/stats", &["GET"], get(stats))
    .add("/api/v1/openapi.json", &["GET"], get(openapi_doc))
}

/// The API routes (method, path), as served.
pub fn api_routes() -> Vec<(&'static str, &'static str)> {
    routes().list
}

fn asset(name: &str) -> Option<Response> {
    WEB_ASSETS
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, ct, bytes)| {
            (
                [
                    (header::CONTENT_TYPE, *ct),
                    (header::CACHE_CONTROL, "no-cache"),
                ],
                *bytes,
            )
                .into_response()
        })
}

async fn page_index() -> Response {
    asset("index.html")
        .unwrap_or_else(|| (StatusCode::NOT_FOUND, "web/index.html is missing").into_response())
}

async fn page_asset(axum::extract::Path(name): axum::extract::Path<String>) -> Response {
    match asset(&name) {
        Some(r) => r,
        None => api::ApiError::not_found(format!("no such page asset {name:?}")).into_response(),
    }
}

pub fn router(state: Shared) -> Router {
    routes()
        .router
        .route("/", get(page_index))
        .route("/{file}", get(page_asset))
        .fallback(api::no_route)
        .method_not_allowed_fallback(api::method_not_allowed)
        .with_state(state)
}

/// Default admin-token file: next to an SQLite store, else in /var/lib/rate-ctl.
fn default_token_path(store_url: &str) -> PathBuf {
    if let Some(p) = store_url.strip_prefix("sqlite:") {
        let p = p.split('?').next().unwrap_or(p);
        let p = p.strip_prefix("//").unwrap_or(p);
        if let Some(dir) = Path::new(p).parent() {
            if !dir.as_os_str().is_empty() {
                return dir.join("admin.token");
            }
        }
    }
    PathBuf::from("/var/lib/rate-ctl/admin.token")
}

/// Version poller shared by all long-polls of this instance.
fn spawn_version_poller(state: &Shared) {
    let weak = Arc::downgrade(state);
    tokio::spawn(async move {
        let mut failing = false;
        loop {
            tokio::time::sleep(VERSION_POLL).await;
            let Some(st) = weak.upgrade() else { return };
            match st.store.version().await {
                Ok(v) => {
                    if failing {
                        info!("store reachable again");
                        failing = false;
                    }
                    st.announce(v);
                }
                Err(e) => {
                    if !failing {
                        warn!(error = %e, "cannot read the config version; long-polls wait");
                        failing = true;
                    }
                }
            }
        }
    });
}

pub async fn run(store_url: &str, a: ServeArgs) -> Result<(), String> {
    if a.list_routes {
        for (m, p) in api_routes() {
            println!("{m} {p}");
        }
        return Ok(());
    }
    let token_path = a
        .admin_token_file
        .clone()
        .unwrap_or_else(|| default_token_path(store_url));
    let tokens = Tokens::load(
        &token_path,
        a.read_token_file.as_deref(),
        a.agent_token_file.as_deref(),
    )?;
    let store = Store::open(store_url)
        .await
        .map_err(|e| format!("{e} (--store {})", redact_url(store_url)))?;
    let v = store.version().await.map_err(|e| e.to_string())?;
    let (tx, rx) = watch::channel(v);
    let state = Arc::new(AppState {
        store,
        tokens,
        version: rx,
        version_tx: tx,
        freshness_ms: a.freshness,
    });
    spawn_version_poller(&state);
    let listener = tokio::net::TcpListener::bind(&a.listen)
        .await
        .map_err(|e| format!("--listen {}: {e}", a.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    {
        use std::io::Write as _;
        let mut o = std::io::stdout().lock();
        match &state.tokens.admin_source {
            auth::AdminSource::Env => {
                let _ = writeln!(o, "admin token: from RATE_CTL_ADMIN_TOKEN");
            }
            auth::AdminSource::File { path, created } => {
                let _ = writeln!(
                    o,
                    "admin token: {}{}",
                    path.display(),
                    if *created { " (created)" } else { "" }
                );
            }
        }
        let _ = writeln!(o, "listening on http://{addr}");
        let _ = o.flush();
    }
    info!(%addr, store = %redact_url(store_url), version = v, "serving");
    let shutdown = super::agent::shutdown_signal()
        .map_err(|e| format!("cannot install signal handlers: {e}"))?;
    // Long-polls would hold a graceful shutdown for up to 30 s: stop at once
    // instead (nothing is lost: every change is one committed transaction).
    tokio::select! {
        r = axum::serve(listener, router(state)) => r.map_err(|e| e.to_string()),
        _ = shutdown => Ok(()),
    }
}
