//! Secret values that never print: `Debug` and `Display` show a placeholder.

use std::fmt;

/// A secret string, such as an API key. It has no `Serialize`, and formats as `[redacted]`.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretString(String);

impl SecretString {
    /// Wrap a secret.
    pub fn new(value: impl Into<String>) -> Self {
        SecretString(value.into())
    }

    /// The secret itself, for the one place that must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl fmt::Display for SecretString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_formats_the_value() {
        let secret = SecretString::new("sk-ant-12345");
        assert_eq!(format!("{secret} {secret:?} {:?}", Some(&secret)), "[redacted] [redacted] Some([redacted])");
        assert_eq!(secret.expose(), "sk-ant-12345");
    }
}
