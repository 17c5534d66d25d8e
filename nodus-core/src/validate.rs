//! Validation of user-written documents: every error names the field, the rule and the value.
