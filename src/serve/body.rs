//! Request bodies (a JSON object of known keys, typed field access) and
//! JSON answers, shared by the resource handlers.

use std::collections::{BTreeMap, HashMap};
use std::str::FromStr;

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

/// The body as a JSON object whose keys are all in `allowed`, none of them
/// twice (400 otherwise).
pub fn object(body: &[u8], allowed: &[&str]) -> Result<Map<String, Value>, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(None, format!("malformed JSON: {e}")))?;
    no_duplicate_keys(body)?;
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

/// 400 naming the first key that appears twice in one object of `json`
/// (`match.ip` for one inside `match`): a JSON parser keeps the last value
/// silently, so `{"rate": 1, "rate": 1000}` would not mean what its first
/// reader saw. Call on JSON that parses.
pub fn no_duplicate_keys(json: &[u8]) -> Result<(), ApiError> {
    match duplicate_key(json) {
        Some(k) => Err(ApiError::bad_request(
            Some(&k),
            format!("{k}: the key appears twice"),
        )),
        None => Ok(()),
    }
}

/// The dotted path of the first key that appears twice in one object of
/// `json`, if any (`None` also for JSON that does not parse).
pub fn duplicate_key(json: &[u8]) -> Option<String> {
    use serde::de::DeserializeSeed;
    let found = std::cell::RefCell::new(None);
    let mut de = serde_json::Deserializer::from_slice(json);
    let _ = Walk {
        path: String::new(),
        found: &found,
    }
    .deserialize(&mut de);
    found.into_inner()
}

/// Walks a JSON document, stopping at the first duplicate key.
struct Walk<'a> {
    path: String,
    found: &'a std::cell::RefCell<Option<String>>,
}

impl<'de> serde::de::DeserializeSeed<'de> for Walk<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Walk<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("JSON")
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<(), A::Error> {
        let mut i = 0;
        while a
            .next_element_seed(Walk {
                path: format!("{}[{i}]", self.path),
                found: self.found,
            })?
            .is_some()
        {
            i += 1;
        }
        Ok(())
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> Result<(), A::Error> {
        let mut seen = std::collections::HashSet::new();
        while let Some(k) = m.next_key::<String>()? {
            let path = if self.path.is_empty() {
                k.clone()
            } else {
                format!("{}.{k}", self.path)
            };
            if !seen.insert(k) {
                *self.found.borrow_mut() = Some(path);
                return Err(serde::de::Error::custom("duplicate key"));
            }
            m.next_value_seed(Walk {
                path,
                found: self.found,
            })?;
        }
        Ok(())
    }
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
    /// A whole number that may be negative (its range is the model's to
    /// check; this only refuses what does not fit 32 bits).
    pub fn int(&self, k: &str) -> Result<Option<i32>, ApiError> {
        match self.present(k) {
            None => Ok(None),
            Some(v) => match v.as_i64().and_then(|n| i32::try_from(n).ok()) {
                Some(n) => Ok(Some(n)),
                None => Err(ApiError::invalid(
                    k,
                    format!("must be a whole number, got {v}"),
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
    /// A list of strings (`each`); absent or null = empty.
    pub fn strings(&self, k: &str) -> Result<Vec<String>, ApiError> {
        match self.present(k) {
            None => Ok(Vec::new()),
            Some(Value::Array(a)) => a
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::String(s) => Ok(s.clone()),
                    _ => Err(ApiError::invalid(&format!("{k}[{i}]"), "must be a string")),
                })
                .collect(),
            Some(_) => Err(ApiError::invalid(k, "must be a list of strings")),
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

/// Query parameter `name` as a `T` that `valid` accepts; `None` when it is
/// absent, 400 naming it with `problem` ("limit: must be 1 to 1000") when
/// it is not such a value.
/// A number query parameter within `range` (`default` when absent); 400
/// `name: must be LO to HI` otherwise.
pub fn query_in<T: FromStr + PartialOrd + std::fmt::Display>(
    q: &HashMap<String, String>,
    name: &str,
    range: std::ops::RangeInclusive<T>,
    default: T,
) -> Result<T, ApiError> {
    let problem = format!("{name}: must be {} to {}", range.start(), range.end());
    Ok(query_param(q, name, |n| range.contains(n), &problem)?.unwrap_or(default))
}

pub fn query_param<T: FromStr>(
    q: &HashMap<String, String>,
    name: &str,
    valid: impl Fn(&T) -> bool,
    problem: &str,
) -> Result<Option<T>, ApiError> {
    match q.get(name) {
        None => Ok(None),
        Some(s) => s
            .parse::<T>()
            .ok()
            .filter(valid)
            .map(Some)
            .ok_or_else(|| ApiError::bad_request(Some(name), problem)),
    }
}
