//! `nodus agentrun egress NAME`: a run's egress records (its result `egress`, JSON Lines) as
//! a table, a JSON array or the lines as kept.

use serde_json::Value;

use crate::error::{Error, Result};
use crate::jsonpath::scalar_text;
use crate::table::Table;

/// The records of the result `egress` (`bytes`), shown as `output` asks: `json`, `jsonl`, or
/// a table (none).
pub fn render(bytes: &[u8], output: Option<&str>) -> Result<String> {
    let text = std::str::from_utf8(bytes)
        .map_err(|_| Error::input("the run's egress result is not UTF-8"))?;
    if output == Some("jsonl") {
        return Ok(text.to_string());
    }
    let records = text
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            serde_json::from_str::<Value>(line)
                .map_err(|e| Error::input(format!("an egress record is not JSON: {e}")))
        })
        .collect::<Result<Vec<Value>>>()?;
    if output == Some("json") {
        let array = Value::Array(records);
        return Ok(format!(
            "{}\n",
            serde_json::to_string_pretty(&array).unwrap_or_default()
        ));
    }
    if records.is_empty() {
        return Ok("No connections.\n".to_string());
    }
    let mut table = Table::new(&[
        "TIME",
        "HOST:PORT",
        "ADDRESS",
        "VERDICT",
        "RULE",
        "BYTES",
        "DURATION",
    ]);
    for record in &records {
        let field = |name: &str| record.get(name).map(scalar_text).unwrap_or_default();
        let address = record
            .get("address")
            .map(scalar_text)
            .unwrap_or_else(|| "-".to_string());
        table.rows.push(vec![
            field("time"),
            format!("{}:{}", field("host"), field("port")),
            address,
            field("verdict"),
            field("rule").replace('\n', " "),
            format!("{} out, {} in", field("bytesOut"), field("bytesIn")),
            format!("{}ms", field("durationMs")),
        ]);
    }
    Ok(table.render())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINES: &str = concat!(
        r#"{"time":"2026-12-01T10:00:00Z","host":"files.test","port":80,"address":"127.0.0.1","verdict":"allowed","rule":"spec.network.allow[0]","bytesOut":70,"bytesIn":120,"durationMs":3}"#,
        "\n",
        r#"{"time":"2026-12-01T10:00:01Z","host":"other.test","port":80,"verdict":"refused","rule":"other.test is not in spec.network.allow","bytesOut":0,"bytesIn":0,"durationMs":0}"#,
        "\n"
    );

    #[test]
    fn records_show_as_a_table_json_or_the_lines_kept() {
        let table = render(LINES.as_bytes(), None).expect("a table");
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3, "{table}");
        for header in [
            "TIME",
            "HOST:PORT",
            "ADDRESS",
            "VERDICT",
            "RULE",
            "BYTES",
            "DURATION",
        ] {
            assert!(lines[0].contains(header), "{table}");
        }
        assert!(lines[1].contains("files.test:80") && lines[1].contains("127.0.0.1"));
        assert!(lines[1].contains("70 out, 120 in") && lines[1].contains("3ms"));
        assert!(lines[2].contains("other.test:80") && lines[2].contains(" - "));
        assert!(lines[2].contains("refused") && lines[2].contains("is not in"));
        let json: Value =
            serde_json::from_str(&render(LINES.as_bytes(), Some("json")).expect("json"))
                .expect("an array");
        assert_eq!(json.as_array().map(Vec::len), Some(2));
        assert_eq!(json[1]["verdict"], "refused");
        assert_eq!(
            render(LINES.as_bytes(), Some("jsonl")).expect("lines"),
            LINES
        );
        assert_eq!(render(b"", None).expect("none"), "No connections.\n");
        assert!(render(b"{not json\n", None).is_err());
    }
}
