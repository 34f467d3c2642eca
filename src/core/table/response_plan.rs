//! A strategy's response options (`count_if`, `cost_from`, `cost_after`)
//! compiled against the table's dimensions; what a request then owes is
//! `core::response`'s.

use crate::core::model::response::{parse_cost, StatusSet};

/// A strategy's response options as a table compiles them: the `count_if`
/// set and the table's dimension indexes of `cost_from` and `cost_after`.
#[derive(Debug, Clone)]
pub struct ResponsePlan {
    pub count_if: StatusSet,
    pub cost_from: Option<usize>,
    pub cost_after: Option<usize>,
}

impl ResponsePlan {
    /// Is anything settled when the request ends?
    #[inline]
    pub fn deferred(&self) -> bool {
        !self.count_if.is_empty() || self.cost_after.is_some()
    }

    /// The request's cost up front: `cost_from`'s value, 1 when it has
    /// none or the value is absent; `Err(1)` when the value is not a cost
    /// (the caller logs, at most once a minute).
    #[inline]
    pub fn cost<V: super::Values + ?Sized>(&self, values: &V) -> Result<u64, u64> {
        let Some(d) = self.cost_from else {
            return Ok(1);
        };
        match values.value(d) {
            None => Ok(1),
            Some([]) => Ok(1),
            Some(v) => parse_cost(v).ok_or(1),
        }
    }
}
