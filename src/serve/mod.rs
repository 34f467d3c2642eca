//! `rate-ctl serve`: the REST API (docs/API.md), the admin page and the
//! agents' long-poll, over the config store.
//!
//! Stateless: every piece of state is in the store, so several instances
//! may serve one MariaDB. Each instance polls the one-row config version
//! every [`VERSION_POLL`] in one task and shares the result with every
//! waiting long-poll through a watch channel (changes made by this instance
//! are announced at once).

pub mod audit;
pub mod auth;
pub mod bans;
pub mod blacklist;
pub mod body;
pub mod conn;
pub mod error;
pub mod hosts;
mod input;
pub mod keys;
pub mod metrics;
pub mod openapi;
pub mod snapshot;
pub mod stats;
pub mod strategies;
pub mod tls;
pub mod tokens;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, MethodRouter};
use axum::Router;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::store::{redact_url, Store, StoreError};
use auth::{ReadToken, Tokens};
use body::{json_response, ok};
use error::{ApiError, ApiResult};
use serde_json::json;

include!(concat!(env!("OUT_DIR"), "/web_assets.rs"));

/// How often each instance reads the config version for its long-polls.
pub const VERSION_POLL: Duration = Duration::from_millis(50);
/// Largest body of `POST /api/v1/strategies/import`.
pub const IMPORT_BODY_LIMIT: usize = 64 << 20;
/// Longest hold of `GET /api/v1/snapshot?after=V`.
pub const LONG_POLL: Duration = Duration::from_secs(30);

/// Why `rate-ctl serve` could not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Token(#[from] auth::TokenError),
    /// The store could not be opened (its URL without the password).
    #[error("{0} (--store {1})")]
    Store(StoreError, String),
    #[error("{0}")]
    Version(StoreError),
    #[error("--listen {0}: {1}")]
    Listen(String, std::io::Error),
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
    #[error("{0}")]
    Io(std::io::Error),
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
}

/// What `rate-ctl serve` is started with (the command line's `serve`
/// arguments).
pub struct ServeOptions {
    /// Address to listen on (port 0: any free port).
    pub listen: String,
    /// The admin token's file; `None`: next to an SQLite store, else in
    /// /var/lib/rate-ctl.
    pub admin_token_file: Option<PathBuf>,
    pub read_token_file: Option<PathBuf>,
    pub agent_token_file: Option<PathBuf>,
    /// A host counts as fresh while its heartbeat is at most this old.
    pub freshness_ms: u64,
    /// Most connections served at once (lowered to what the descriptor
    /// limit allows); the next ones are answered 503.
    pub max_connections: usize,
    /// HTTPS: PEM certificate chain and private key.
    pub tls: Option<(PathBuf, PathBuf)>,
}

/// What every handler sees.
pub struct AppState {
    pub store: Store,
    pub tokens: Tokens,
    pub version: watch::Receiver<u64>,
    version_tx: watch::Sender<u64>,
    pub freshness_ms: u64,
    /// The last snapshot built for the long-polls, shared by all of them.
    pub snapshots: snapshot::SnapshotCache,
    /// Connection counters of the accept loop.
    pub conns: Arc<conn::ConnStats>,
    /// When this instance last wrote each named token's `last_used`.
    pub token_touched: std::sync::Mutex<std::collections::HashMap<String, u64>>,
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

/// A router and the list of API routes it serves (method, path); each
/// resource module has one (`router()`), merged here in listing order.
#[derive(Default)]
pub struct Routes {
    router: Router<Shared>,
    list: Vec<(&'static str, &'static str)>,
}

impl Routes {
    pub fn add(
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

    fn merge(mut self, other: Routes) -> Routes {
        self.list.extend(other.list);
        self.router = self.router.merge(other.router);
        self
    }
}

fn routes() -> Routes {
    Routes::default()
        .add("/api/v1/health", &["GET"], get(health))
        .add("/api/v1/version", &["GET"], get(version))
        .merge(strategies::router())
        .merge(blacklist::router())
        .merge(bans::router())
        .merge(hosts::router())
        .merge(audit::router())
        .merge(snapshot::router())
        .merge(stats::router())
        .merge(tokens::router())
        .merge(keys::router())
        .add("/api/v1/openapi.json", &["GET"], get(openapi_doc))
}

/// `ok` or `unavailable`, nothing more, to anyone; with a valid token
/// also the config version or the store's error.
async fn health(State(st): State<Shared>, headers: axum::http::HeaderMap) -> Response {
    let known = auth::identify(&st, &headers).await.is_ok();
    match st.store.version().await {
        Ok(v) if known => json_response(StatusCode::OK, json!({"ok": true, "version": v})),
        Ok(_) => json_response(StatusCode::OK, json!({"ok": true})),
        Err(e) => {
            let message = if known {
                e.to_string()
            } else {
                "unavailable".to_string()
            };
            json_response(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"ok": false, "error": {"field": null, "message": message}}),
            )
        }
    }
}

async fn openapi_doc() -> Response {
    json_response(StatusCode::OK, openapi::document())
}

async fn version(State(st): State<Shared>, _: ReadToken) -> ApiResult {
    ok(json!({"version": st.store.version().await?}))
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
        None => ApiError::not_found(format!("no such page asset {name:?}")).into_response(),
    }
}

pub fn router(state: Shared) -> Router {
    routes()
        .router
        .route("/metrics", get(metrics::metrics))
        .route("/", get(page_index))
        .route("/{file}", get(page_asset))
        .fallback(error::no_route)
        .method_not_allowed_fallback(error::method_not_allowed)
        .layer(axum::middleware::from_fn(input::check))
        .layer(axum::middleware::from_fn(security_headers))
        .with_state(state)
}

/// The page's Content-Security-Policy: its own scripts, styles and API
/// only (the favicon is an empty `data:` image), never in a frame.
pub const CSP: &str = "default-src 'self'; img-src 'self' data:; object-src 'none'; \
base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// Headers on every answer (page and API): CSP, no framing, no MIME
/// sniffing, no Referer leaving the page.
async fn security_headers(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let mut res = next.run(req).await;
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        header::HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_FRAME_OPTIONS,
        header::HeaderValue::from_static("DENY"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        header::HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        header::HeaderValue::from_static("no-referrer"),
    );
    res
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

/// The fleet leader candidate of this instance (src/fleet/leader.rs): every
/// period, if any strategy has `split: demand`, lead if possible and
/// allocate the leases.
fn spawn_fleet_leader(state: &Shared, me: String) {
    let weak = Arc::downgrade(state);
    tokio::spawn(async move {
        let mut c = crate::fleet::leader::Coordinator::new(me);
        let mut failing = false;
        // The strategies, read again only when the version moves.
        let mut known: Option<(u64, Vec<crate::store::record::StrategyRecord>)> = None;
        loop {
            tokio::time::sleep(crate::fleet::leader::LEADER_PERIOD).await;
            let Some(st) = weak.upgrade() else { return };
            let r = async {
                let v = st.store.version().await?;
                // Only what changed, like the agents (issue 29): a full read
                // of a large table holds SQLite's one connection for as long
                // as the long-polls wait for it.
                let mut current = false;
                if let Some(k) = known.as_mut().filter(|k| k.0 != v) {
                    if let Some(c) = st.store.changes_since(k.0).await? {
                        let gone: std::collections::HashSet<u32> = c
                            .removed
                            .iter()
                            .copied()
                            .chain(c.bad_rows.iter().filter_map(|b| u32::try_from(b.id).ok()))
                            .chain(c.strategies.iter().map(|r| r.id))
                            .collect();
                        k.1.retain(|r| !gone.contains(&r.id));
                        k.1.extend(
                            c.strategies
                                .into_iter()
                                .map(crate::store::valid::Valid::into_inner),
                        );
                        k.1.sort_by_key(|r| r.id);
                        k.0 = c.version;
                        current = true;
                    }
                }
                if !current && known.as_ref().is_none_or(|k| k.0 != v) {
                    let snap = st.store.snapshot().await?;
                    known = Some((
                        snap.version,
                        snap.strategies
                            .into_iter()
                            .map(crate::store::valid::Valid::into_inner)
                            .collect(),
                    ));
                }
                let strategies = known.as_ref().map_or(&[][..], |k| &k.1[..]);
                c.tick(&st.store, strategies, st.freshness_ms).await
            }
            .await;
            match r {
                Ok(()) => failing = false,
                Err(e) => {
                    if !failing {
                        warn!(error = %e, "fleet leases: cannot allocate; agents keep their leases until they expire");
                        failing = true;
                    }
                }
            }
        }
    });
}

pub async fn run(store_url: &str, a: ServeOptions) -> Result<(), ServeError> {
    let token_path = a
        .admin_token_file
        .clone()
        .unwrap_or_else(|| default_token_path(store_url));
    let tokens = Tokens::load(
        &token_path,
        a.read_token_file.as_deref(),
        a.agent_token_file.as_deref(),
    )?;
    let tls = match &a.tls {
        Some((cert, key)) => Some(tls::server_config(cert, key)?),
        None => None,
    };
    let nofile = conn::raise_nofile();
    let max_connections = conn::effective_cap(a.max_connections, nofile);
    if max_connections < a.max_connections {
        warn!(
            wanted = a.max_connections,
            max_connections, nofile, "--max-connections lowered to fit the descriptor limit"
        );
    }
    let store = Store::open(store_url)
        .await
        .map_err(|e| ServeError::Store(e, redact_url(store_url)))?;
    let v = store.version().await.map_err(ServeError::Version)?;
    let (tx, rx) = watch::channel(v);
    let state = Arc::new(AppState {
        store,
        tokens,
        version: rx,
        version_tx: tx,
        freshness_ms: a.freshness_ms,
        snapshots: snapshot::SnapshotCache::default(),
        conns: Arc::new(conn::ConnStats::default()),
        token_touched: Default::default(),
    });
    spawn_version_poller(&state);
    let listener = tokio::net::TcpListener::bind(&a.listen)
        .await
        .map_err(|e| ServeError::Listen(a.listen.clone(), e))?;
    let addr = listener.local_addr().map_err(ServeError::Io)?;
    let leader_name = format!("serve:{addr}:{}", std::process::id());
    spawn_fleet_leader(&state, leader_name.clone());
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
        let scheme = if tls.is_some() { "https" } else { "http" };
        let _ = writeln!(o, "listening on {scheme}://{addr}");
        let _ = o.flush();
    }
    info!(%addr, store = %redact_url(store_url), version = v, max_connections, "serving");
    let shutdown = crate::signal::shutdown_signal().map_err(ServeError::Signals)?;
    // Long-polls would hold a graceful shutdown for up to 30 s: stop at once
    // instead (nothing is lost: every change is one committed transaction).
    let store = state.clone();
    let r = tokio::select! {
        r = conn::serve(listener, router(state.clone()), max_connections, state.conns.clone(), tls) => r.map_err(ServeError::Io),
        _ = shutdown => Ok(()),
    };
    // Another instance takes over at once instead of after the expiry.
    let _ = store.store.resign(&leader_name).await;
    r
}
