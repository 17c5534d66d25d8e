//! Chunked lists, Kubernetes style: `limit` (how many objects a list answer holds at most)
//! and `continue` (the token of the previous answer's `metadata.continue`, where the next
//! answer starts).
//!
//! A token is the store's position after the last object of its page and a MAC over that
//! position, the project, the kind and the selectors, keyed by a key derived from the
//! server's secret key: a token the server did not make for this very list is refused, and
//! cannot reach documents of another project, kind or selector. Tokens do not expire (a
//! position stays meaningful while documents come and go).

use std::num::NonZeroUsize;

use nodus_core::resource::Kind;
use nodus_core::store::{Position, Selector};
use nodus_core::validate::{Invalid, shown};

/// The largest `limit`.
pub const MAX_LIMIT: usize = 1000;

const TOKEN_DOMAIN: &[u8] = b"nodus list continue v1";
/// Hex digits of the MAC a token carries (128 bits).
const MAC_HEX: usize = 32;

/// The key `continue` tokens are signed with: derived from the server's secret key, so
/// replicas that share `secret.key` accept each other's tokens.
#[derive(Clone)]
pub struct ContinueKey([u8; 32]);

impl ContinueKey {
    /// The continue key of a server key.
    pub fn derive(server_key: &[u8; 32]) -> Self {
        ContinueKey(nodus_core::digest::hmac_sha256(server_key, TOKEN_DOMAIN))
    }

    fn mac(&self, list: &ListOf<'_>, position: Position) -> String {
        // Each part is JSON (quoted, escaped), so no two different lists write the same text.
        let text = serde_json::json!([
            list.project,
            list.kind.plural(),
            list.selector.labels,
            list.selector.fields,
            position.0,
        ])
        .to_string();
        let mut mac = nodus_core::digest::hmac_sha256_hex(&self.0, text.as_bytes());
        mac.truncate(MAC_HEX);
        mac
    }

    /// The token of the page of `list` that starts after `position`.
    pub fn token(&self, list: &ListOf<'_>, position: Position) -> String {
        format!("{:x}.{}", position.0, self.mac(list, position))
    }

    /// Where a page of `list` starts, from a token of an earlier page of the same list.
    pub fn position(&self, list: &ListOf<'_>, token: &str) -> Result<Position, Invalid> {
        let refused = || {
            Invalid::new(
                "continue",
                "must be the metadata.continue of an earlier answer to this same list \
                 (project, kind, labelSelector and fieldSelector)",
                shown(token),
            )
        };
        let (position, mac) = token.split_once('.').ok_or_else(refused)?;
        if position.is_empty() || position.len() > 16 || position.starts_with('+') {
            return Err(refused());
        }
        let position = Position(u64::from_str_radix(position, 16).map_err(|_| refused())?);
        let expected = self.mac(list, position);
        let same = mac.len() == expected.len()
            && mac
                .bytes()
                .zip(expected.bytes())
                .fold(0u8, |differ, (a, b)| differ | (a ^ b))
                == 0;
        if same { Ok(position) } else { Err(refused()) }
    }
}

/// Which list a token belongs to.
#[derive(Debug, Clone, Copy)]
pub struct ListOf<'a> {
    /// The project.
    pub project: &'a str,
    /// The kind.
    pub kind: Kind,
    /// The selectors.
    pub selector: &'a Selector,
}

/// The `limit` query parameter: a whole number from 1 to [`MAX_LIMIT`].
pub fn limit(text: &str) -> Result<NonZeroUsize, Invalid> {
    text.parse::<NonZeroUsize>()
        .ok()
        .filter(|limit| limit.get() <= MAX_LIMIT)
        .ok_or_else(|| {
            Invalid::new(
                "limit",
                format!("must be a whole number from 1 to {MAX_LIMIT}"),
                shown(text),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> ContinueKey {
        ContinueKey::derive(&[byte; 32])
    }

    #[test]
    fn a_token_holds_for_its_own_list_only() {
        let runs = Selector::default();
        let list = ListOf {
            project: "team",
            kind: Kind::AgentRun,
            selector: &runs,
        };
        let token = key(1).token(&list, Position(41));
        assert_eq!(key(1).position(&list, &token), Ok(Position(41)));
        let red = Selector {
            labels: [("team".to_string(), "red".to_string())].into(),
            ..Default::default()
        };
        let others = [
            ListOf {
                project: "other",
                ..list
            },
            ListOf {
                kind: Kind::Agent,
                ..list
            },
            ListOf {
                selector: &red,
                ..list
            },
        ];
        for other in others {
            let refused = key(1).position(&other, &token).expect_err("another list");
            assert_eq!(refused.field, "continue");
        }
        // Another server key, a changed position, garbage.
        assert!(key(2).position(&list, &token).is_err());
        let (_, mac) = token.split_once('.').expect("a dot");
        for forged in [
            format!("0.{mac}"),
            format!("2a.{mac}"),
            "29".to_string(),
            String::new(),
            "29.".to_string(),
            format!("+29.{mac}"),
            format!("{token}0"),
        ] {
            assert!(key(1).position(&list, &forged).is_err(), "{forged:?}");
        }
    }

    #[test]
    fn limits_from_one_to_a_thousand() {
        assert_eq!(limit("1").map(NonZeroUsize::get), Ok(1));
        assert_eq!(limit("1000").map(NonZeroUsize::get), Ok(1000));
        for bad in [
            "0",
            "1001",
            "-1",
            "",
            "ten",
            "1.5",
            "99999999999999999999999",
        ] {
            let error = limit(bad).expect_err(bad);
            assert_eq!(error.field, "limit");
            assert!(error.rule.contains("1 to 1000"), "{}", error.rule);
        }
    }
}
