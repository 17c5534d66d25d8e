//! Raw command output: bytes kept exactly, written as text when they are UTF-8.

use serde::{Deserialize, Serialize};

/// Bytes a command printed, at most a cap, and whether more were cut off.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Output {
    /// The bytes kept.
    #[serde(with = "bytes_as_text")]
    pub bytes: Vec<u8>,
    /// Whether output past the cap was dropped.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

impl Output {
    /// Output that was not truncated.
    pub fn complete(bytes: impl Into<Vec<u8>>) -> Self {
        Output {
            bytes: bytes.into(),
            truncated: false,
        }
    }

    /// The bytes as text, with invalid sequences replaced (for display and for the model,
    /// never for storage).
    pub fn lossy(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.bytes)
    }
}

/// UTF-8 bytes as a JSON string; anything else as a list of byte values, so nothing is lost.
mod bytes_as_text {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    #[serde(untagged)]
    enum Repr {
        Text(String),
        Raw(Vec<u8>),
    }

    pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        match std::str::from_utf8(bytes) {
            Ok(text) => serializer.serialize_str(text),
            Err(_) => bytes.serialize(serializer),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        Ok(match Repr::deserialize(deserializer)? {
            Repr::Text(text) => text.into_bytes(),
            Repr::Raw(bytes) => bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_binary_round_trip_exactly() {
        for bytes in [b"hello\n".to_vec(), vec![0xff, 0x00, 0xc3], Vec::new()] {
            let output = Output::complete(bytes.clone());
            let json = serde_json::to_string(&output).expect("serialize");
            let back: Output = serde_json::from_str(&json).expect("deserialize");
            assert_eq!(back.bytes, bytes, "{json}");
        }
    }
}
