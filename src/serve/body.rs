//! Request bodies (a JSON object of known keys, typed field access) and
//! JSON answers, shared by the resource handlers.

use std::collections::BTreeMap;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{Map, Value};

use super::error::{ApiError, ApiResult};

pub fn json_response(status: StatusCode, v: Value) -> Response {
    (status, Json(v)).into_response()
}

pub fn ok(v: Value) -> ApiResult {
    Ok(json_response(StatusCode::OK, v))
}

/// The body as a JSON object whose keys are all in `allowed` (400 otherwise).
pub fn object(body: &[u8], allowed: &[&str]) -> Result<Map<String, Value>, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(None, format!("malformed JSON: {e}")))?;
    let Value::Object(o) = v else {
        return Err(ApiError::bad_request(
            None,
            "the body must be a JSON object",
        ));
    };
    if let Some(k) = o.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(ApiError::bad_request(
            Some(k),
            format!(
                "{k}: unknown field (expected one of {})",
                allowed.join(", ")
            ),
        ));
    }
    Ok(o)
}

/// Typed access to body fields; wrong types are 422 naming the field.
pub struct Fields<'a>(pub &'a Map<String, Value>);

impl Fields<'_> {
    pub fn present(&self, k: &str) -> Option<&Value> {
        self.0.get(k).filter(|v| !v.is_null())
    }
    pub fn required<T>(&self, k: &str, v: Option<T>) -> Result<T, ApiError> {
        v.ok_or_else(|| ApiError::invalid(k, "required"))
    }
    pub fn str(&self, k: &str) -> Result<Option<String>, ApiError> {
        match self.present(k) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(ApiError::invalid(k, "must be a string")),
        }
    }
    pub fn uint(&self, k: &str, max: u64) -> Result<Option<u64>, ApiError> {
        match self.present(k) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n <= max => Ok(Some(n)),
                _ => Err(ApiError::invalid(
                    k,
                    format!("must be a whole number from 0 to {max}, got {v}"),
                )),
            },
        }
    }
    pub fn bool(&self, k: &str) -> Result<Option<bool>, ApiError> {
        match self.present(k) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(ApiError::invalid(k, "must be true or false")),
        }
    }
    pub fn parsed<T: std::str::FromStr>(&self, k: &str) -> Result<Option<T>, ApiError>
    where
        T::Err: std::fmt::Display,
    {
        match self.str(k)? {
            None => Ok(None),
            Some(s) => s.parse().map(Some).map_err(|e: T::Err| {
                let m = e.to_string();
                // Model errors already start with the field name.
                let m = m
                    .strip_prefix(&format!("{k}: "))
                    .map(str::to_string)
                    .unwrap_or(m);
                ApiError::invalid(k, m)
            }),
        }
    }
    pub fn conditions(&self) -> Result<BTreeMap<String, String>, ApiError> {
        match self.present("match") {
            None => Ok(BTreeMap::new()),
            Some(Value::Object(m)) => m
                .iter()
                .map(|(d, v)| match v {
                    Value::String(s) => Ok((d.clone(), s.clone())),
                    _ => Err(ApiError::invalid(&format!("match.{d}"), "must be a string")),
                })
                .collect(),
            Some(_) => Err(ApiError::invalid(
                "match",
                "must be an object of dimension: value",
            )),
        }
    }
}

pub fn parse_id(s: &str, what: &str) -> Result<u64, ApiError> {
    s.parse::<u64>()
        .ok()
        .filter(|i| *i > 0)
        .ok_or_else(|| ApiError::not_found(format!("no {what} with id {s:?}")))
}
