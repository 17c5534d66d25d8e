//! The AgentEnvironment resource: environment variables (plain, or read from a `Secret`) and
//! compute for the sandbox of the runs that name it, in Kubernetes' shape.

use std::fmt;

use serde::de::{self, DeserializeOwned, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// `spec` of an AgentEnvironment.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentEnvironmentSpec {
    /// Environment variables of every command of the run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// CPU, memory and GPUs of the run's sandbox; what is left out keeps the server's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute: Option<Compute>,
    /// Where the run's sandbox may connect: nowhere unless this says otherwise.
    #[serde(default, skip_serializing_if = "NetworkSpec::is_default")]
    pub network: NetworkSpec,
}

/// `spec.network`: `egress: none` (the default: no way out at all), or `allowlist` with the
/// hosts and networks the server's egress proxy lets the sandbox reach.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkSpec {
    /// `none` or `allowlist`.
    #[serde(default)]
    pub egress: EgressMode,
    /// What an allowlist allows (each entry a `host` or a `cidr`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<AllowEntry>,
    /// Headers the egress proxy adds to the requests to a host (it ends TLS for that host);
    /// their values never enter the sandbox.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inject: Vec<InjectEntry>,
}

impl NetworkSpec {
    /// `egress: none` with nothing else: what an environment without `network` has.
    pub fn is_default(&self) -> bool {
        *self == NetworkSpec::default()
    }
}

/// `spec.network.egress`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum EgressMode {
    /// No way out at all.
    #[default]
    None,
    /// Through the egress proxy, to what `allow` lists.
    Allowlist,
}

/// One entry of `spec.network.allow`: a `host` (exact, or `*.domain` for its subdomains) or a
/// `cidr` (inside what the operator's `--egress-allow` permits), on `ports` (80 and 443 when
/// left out).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AllowEntry {
    /// A host name, or `*.domain`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// A network, `address/prefix`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cidr: Option<String>,
    /// The ports; 80 and 443 when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<u16>>,
}

/// One entry of `spec.network.inject`: a header the egress proxy adds to every request to
/// `host` (exact, or `*.domain`), its value from a Secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InjectEntry {
    /// The host whose requests get the header.
    pub host: String,
    /// The header's name.
    pub header: String,
    /// Where its value comes from.
    pub value_from: EnvVarSource,
}

/// One environment variable: a plain `value`, or `valueFrom` a Secret's key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnvVar {
    /// The variable's name (letters, digits and `_`, not starting with a digit).
    pub name: String,
    /// Its value, written here in plain text (never a secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Where its value comes from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<EnvVarSource>,
}

/// `valueFrom` of an environment variable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnvVarSource {
    /// A key of a Secret of the run's project.
    pub secret_key_ref: SecretKeyRef,
}

/// A key of a Secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretKeyRef {
    /// The Secret's name.
    pub name: String,
    /// The key in it.
    pub key: String,
}

/// `spec.compute`: the keys Kubernetes uses; any other key is refused.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Compute {
    /// CPUs: `"2"`, `"0.5"` or `"500m"` (thousandths).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Quantity>,
    /// Memory: bytes, or with a suffix (`512Mi`, `2Gi`, `1G`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Quantity>,
    /// Whole GPUs.
    #[serde(
        rename = "nvidia.com/gpu",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub gpu: Option<u32>,
}

/// A Kubernetes quantity as written (a string, or a number written without quotes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(transparent)]
pub struct Quantity(pub String);

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct QuantityVisitor;
        impl Visitor<'_> for QuantityVisitor {
            type Value = Quantity;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a quantity such as \"2\", \"500m\" or \"2Gi\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Quantity, E> {
                Ok(Quantity(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Quantity, E> {
                Ok(Quantity(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Quantity, E> {
                Ok(Quantity(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Quantity, E> {
                Ok(Quantity(v.to_string()))
            }
        }
        deserializer.deserialize_any(QuantityVisitor)
    }
}

impl Quantity {
    /// Thousandths of a CPU (`"2"` → 2000, `"0.5"` and `"500m"` → 500), or `None` when it is
    /// not a CPU quantity.
    pub fn cpu_millis(&self) -> Option<u64> {
        let text = self.0.trim();
        if let Some(millis) = text.strip_suffix('m') {
            return digits(millis)?.parse().ok();
        }
        let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
        if fraction.len() > 3 || (whole.is_empty() && fraction.is_empty()) {
            return None;
        }
        let whole: u64 = if whole.is_empty() {
            0
        } else {
            digits(whole)?.parse().ok()?
        };
        let fraction: u64 = if fraction.is_empty() {
            0
        } else {
            format!("{:0<3}", digits(fraction)?).parse().ok()?
        };
        whole.checked_mul(1000)?.checked_add(fraction)
    }

    /// Bytes (`"512Mi"`, `"2Gi"`, `"1G"`, `"1000"`), or `None` when it is not a memory
    /// quantity.
    pub fn bytes(&self) -> Option<u64> {
        const SUFFIXES: [(&str, u64); 8] = [
            ("Ki", 1 << 10),
            ("Mi", 1 << 20),
            ("Gi", 1 << 30),
            ("Ti", 1 << 40),
            ("k", 1_000),
            ("M", 1_000_000),
            ("G", 1_000_000_000),
            ("T", 1_000_000_000_000),
        ];
        let text = self.0.trim();
        let (number, unit) = SUFFIXES
            .iter()
            .find_map(|(suffix, unit)| text.strip_suffix(suffix).map(|n| (n, *unit)))
            .unwrap_or((text, 1));
        digits(number)?.parse::<u64>().ok()?.checked_mul(unit)
    }
}

fn digits(text: &str) -> Option<&str> {
    (!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())).then_some(text)
}

/// `status` of an AgentEnvironment.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct AgentEnvironmentStatus {}

/// A field that names a stored object (`name` or `project/name`) or holds its spec inline,
/// such as a run's `spec.environment` and `spec.agent`.
#[derive(Debug, Clone, PartialEq)]
pub enum NameOrInline<T> {
    /// `name` or `project/name` of a stored object.
    Name(String),
    /// The whole spec, written in place.
    Inline(Box<T>),
}

impl<T> NameOrInline<T> {
    /// The name, when it is one.
    pub fn name(&self) -> Option<&str> {
        match self {
            NameOrInline::Name(name) => Some(name),
            NameOrInline::Inline(_) => None,
        }
    }
}

impl<T: Serialize> Serialize for NameOrInline<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            NameOrInline::Name(name) => serializer.serialize_str(name),
            NameOrInline::Inline(spec) => spec.serialize(serializer),
        }
    }
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for NameOrInline<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Either<T>(std::marker::PhantomData<T>);
        impl<'de, T: DeserializeOwned> Visitor<'de> for Either<T> {
            type Value = NameOrInline<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a name, `project/name`, or the whole spec as an object")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(NameOrInline::Name(v.to_string()))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                // Read through the same map, so an error inside names its path.
                T::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(|spec| NameOrInline::Inline(Box::new(spec)))
            }
        }
        deserializer.deserialize_any(Either(std::marker::PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_read_as_kubernetes_writes_them() {
        let cpu = |text: &str| Quantity(text.to_string()).cpu_millis();
        assert_eq!(cpu("2"), Some(2000));
        assert_eq!(cpu("0.5"), Some(500));
        assert_eq!(cpu(".25"), Some(250));
        assert_eq!(cpu("500m"), Some(500));
        assert_eq!(cpu("1.5"), Some(1500));
        for bad in [
            "", "m", "two", "1.2345", "-1", "1e3", "1..2", "1.x", "1.+5", "+1",
        ] {
            assert_eq!(cpu(bad), None, "{bad:?}");
        }
        let memory = |text: &str| Quantity(text.to_string()).bytes();
        assert_eq!(memory("2Gi"), Some(2 << 30));
        assert_eq!(memory("512Mi"), Some(512 << 20));
        assert_eq!(memory("1G"), Some(1_000_000_000));
        assert_eq!(memory("1000"), Some(1000));
        for bad in ["", "Gi", "2GB", "1.5Gi", "-1", "99999999999999999999"] {
            assert_eq!(memory(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_reference_is_a_name_or_a_whole_spec() {
        let named: NameOrInline<AgentEnvironmentSpec> =
            serde_json::from_value(serde_json::json!("team/research")).expect("a name");
        assert_eq!(named, NameOrInline::Name("team/research".to_string()));
        let inline: NameOrInline<AgentEnvironmentSpec> = serde_json::from_value(
            serde_json::json!({"env": [{"name": "A", "value": "b"}], "compute": {"cpu": 2}}),
        )
        .expect("inline");
        let NameOrInline::Inline(spec) = &inline else {
            panic!("inline expected")
        };
        assert_eq!(
            spec.compute.as_ref().and_then(|c| c.cpu.clone()),
            Some(Quantity("2".into()))
        );
        assert_eq!(
            serde_json::to_value(&inline).expect("written"),
            serde_json::json!({"env": [{"name": "A", "value": "b"}], "compute": {"cpu": "2"}})
        );
        let unknown = serde_json::from_value::<NameOrInline<AgentEnvironmentSpec>>(
            serde_json::json!({"compute": {"tpu": 1}}),
        );
        assert!(unknown.is_err());
    }
}
