//! The rules of a Budget: none beyond its types.

use super::{Result, Validate};
use crate::resource::BudgetSpec;

impl Validate for BudgetSpec {
    /// A Budget's one field is typed money; its type is its rule.
    fn check_spec(&self) -> Result<()> {
        Ok(())
    }
}
