//! The proof that a record was validated, so that each trust boundary
//! validates once and everything behind it takes the proof instead of
//! checking again.
//!
//! [`Valid`] is made only here, by [`StrategyRecord::into_valid`],
//! [`BlacklistRecord::into_valid`] and [`valid_import`] (each runs the
//! record's own `validate`, one implementation). The boundaries that make
//! one: input (the CLI's arguments, `rate-ctl serve`'s request bodies,
//! an import file) and store reads (a row, an API snapshot). The store's
//! write functions take only `Valid` records, so nothing unvalidated can be
//! stored and nothing validated is validated again there; the agent turns
//! a `Valid` strategy record into the core's
//! [`ValidStrategy`](rate_ctl::core::model::ValidStrategy) without the full
//! check (see `fleet/rates.rs`).

use std::collections::HashMap;
use std::ops::Deref;

use super::error::{Field, Invalid, StoreError};
use super::record::{BlacklistRecord, StrategyRecord};

/// A record that passed its `validate` (fields checked, `ip` values
/// canonical). Read it through `Deref`; change it only by taking it apart
/// ([`Valid::into_inner`]) and validating again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Valid<T>(T);

impl<T> Valid<T> {
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T> Deref for Valid<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl StrategyRecord {
    /// Validates (see [`validate`](Self::validate)) and keeps the proof.
    pub fn into_valid(mut self) -> Result<Valid<StrategyRecord>, Invalid> {
        self.validate()?;
        Ok(Valid(self))
    }
}

impl BlacklistRecord {
    /// Validates (see [`validate`](Self::validate)) and keeps the proof.
    pub fn into_valid(mut self) -> Result<Valid<BlacklistRecord>, Invalid> {
        self.validate()?;
        Ok(Valid(self))
    }
}

/// The lines of an import file, each validated, names and ids each used
/// once: what [`Store::import`](super::Store::import) takes.
#[derive(Debug)]
pub struct ValidImport {
    pub(super) records: Vec<(usize, Valid<StrategyRecord>)>,
    /// Name → the line that uses it.
    pub(super) names: HashMap<String, usize>,
    /// Id (those given) → the line that uses it.
    pub(super) ids: HashMap<u32, usize>,
}

/// Validates JSON-lines records (with their 1-based line numbers) for an
/// import. Errors name the line: the first line that is invalid or repeats
/// an earlier line's name or id.
pub fn valid_import(records: Vec<(usize, StrategyRecord)>) -> Result<ValidImport, StoreError> {
    let mut valid = Vec::with_capacity(records.len());
    let mut names: HashMap<String, usize> = HashMap::new();
    let mut ids: HashMap<u32, usize> = HashMap::new();
    for (line, rec) in records {
        let at = |cause| StoreError::Import { line, cause };
        let rec = rec.into_valid().map_err(at)?;
        if let Some(first) = names.insert(rec.name.clone(), line) {
            return Err(at(Invalid::new(
                Field::Name,
                "name",
                format!("{:?} already used on line {first}", rec.name),
            )));
        }
        if rec.id != 0 {
            if let Some(first) = ids.insert(rec.id, line) {
                return Err(at(Invalid::new(
                    Field::Id,
                    "id",
                    format!("{} already used on line {first}", rec.id),
                )));
            }
        }
        valid.push((line, rec));
    }
    Ok(ValidImport {
        records: valid,
        names,
        ids,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(name: &str) -> StrategyRecord {
        serde_json::from_str(&format!(
            r#"{{"name":" {name} ","match":{{"ip":"::ffff:1.2.3.4"}},"algorithm":"token_bucket","rate":100,"burst":20}}"#
        ))
        .unwrap()
    }

    #[test]
    fn valid_records_are_canonical_and_invalid_ones_name_the_field() {
        let v = rec("pay").into_valid().unwrap();
        assert_eq!(v.name, "pay");
        assert_eq!(v.conditions["ip"], "1.2.3.4");
        let mut bad = rec("pay");
        bad.rate = 0;
        assert_eq!(bad.into_valid().unwrap_err().field, Some(Field::Rate));
    }

    #[test]
    fn import_names_the_first_bad_line() {
        let mut bad = rec("c");
        bad.rate = 0;
        // Line 2 repeats line 1's (trimmed) name before line 3 is reached.
        let e = valid_import(vec![(1, rec("a")), (2, rec("a")), (3, bad)]).unwrap_err();
        assert_eq!(e.to_string(), r#"line 2: name: "a" already used on line 1"#);
        let v = valid_import(vec![(1, rec("a")), (2, rec("b"))]).unwrap();
        assert_eq!(v.records.len(), 2);
        assert_eq!(v.names["b"], 2);
    }
}
