//! `rate-ctl key show|reset` against the store or serve (issue 33).

use serde_json::{json, Value};

use super::http::percent_encode;
use super::{Backend, Result, CLI};
use crate::store::StoreError;

impl Backend {
    /// Records a reset of `key` of strategy `id`: the stored row as JSON
    /// (`id`, `strategy`, `key`, `at`).
    pub async fn key_reset(&self, id: u32, key: &str) -> Result<Value> {
        match self {
            Backend::Store(s) => {
                let r = s.key_reset(id, key, CLI).await?;
                Ok(json!({"id": r.id, "strategy": id, "key": r.key, "at": r.at_ms}))
            }
            Backend::Api(a) => {
                let path = format!("/api/v1/strategies/{id}/keys/{}", percent_encode(key));
                a.call("DELETE", &path, None).await
            }
        }
    }

    /// The fleet view of `key` of strategy `id` (serve only: the agents
    /// answer serve's questions).
    pub async fn key_show(&self, id: u32, key: &str) -> Result<Value> {
        match self {
            Backend::Store(_) => Err(StoreError::Http(
                "key show asks the agents through rate-ctl serve: give --api URL (and --token)"
                    .into(),
            )),
            Backend::Api(a) => {
                let path = format!("/api/v1/strategies/{id}/keys/{}", percent_encode(key));
                a.call("GET", &path, None).await
            }
        }
    }
}
