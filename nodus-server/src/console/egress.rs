//! The "Egress" section of the console's run page: for a run whose sandbox had an allowlist,
//! its counts and the connections its sandbox asked the egress proxy for (its journal), each
//! host, rule and address escaped like everything else the console shows.

use nodus_core::egress_log::EgressLog;
use serde_json::Value;

use super::html::Html;
use crate::error::ApiError;
use crate::state::AppState;

/// Connections the section lists (the newest are in the run's `egress` result).
const SHOWN: usize = 200;

/// Appends the section's body to `html` (the run page writes its heading): the counts and
/// connections when `run` had an allowlist (it has `status.egress`), else that it had none.
pub async fn section(html: &mut Html, state: &AppState, run: &Value) -> Result<(), ApiError> {
    let (false, Some(uid)) = (
        run["status"]["egress"].is_null(),
        run["metadata"]["uid"].as_str(),
    ) else {
        html.raw(
            "<p class=\"muted\" id=\"egress-none\">No network connections: this run had no \
             allowlist.</p>",
        );
        return Ok(());
    };
    let log = nodus_core::egress_log::read(state.store.as_ref(), uid).await?;
    html.append(render(&log));
    Ok(())
}

/// The section for `log`.
fn render(log: &EgressLog) -> Html {
    let mut html = Html::new();
    let counts = &log.counts;
    html.raw("<p id=\"egress-counts\">")
        .text(counts.allowed)
        .raw(" allowed, ")
        .text(counts.refused)
        .raw(" refused; ")
        .text(counts.bytes_out)
        .raw(" bytes out, ")
        .text(counts.bytes_in)
        .raw(" bytes in</p>");
    if log.records.is_empty() {
        html.raw("<p class=\"muted\">No connections.</p>");
        return html;
    }
    html.raw(
        "<div class=\"table\"><table id=\"egress\"><thead><tr><th>Time</th><th>Host:port</th>\
         <th class=\"hide-narrow\">Address</th><th>Verdict</th><th>Rule</th>\
         <th class=\"num\">Bytes out / in</th><th class=\"num hide-narrow\">Duration</th>\
         </tr></thead><tbody>",
    );
    for record in log.records.iter().take(SHOWN) {
        html.raw("<tr><td class=\"muted\">")
            .text(&record.time)
            .raw("</td><td>")
            .text(&record.host)
            .raw(":")
            .text(record.port)
            .raw("</td><td class=\"hide-narrow\">")
            .text(record.address.as_deref().unwrap_or("-"))
            .raw("</td><td class=\"verdict\">")
            .text(&record.verdict)
            .raw("</td><td>")
            .text(&record.rule)
            .raw("</td><td class=\"num\">")
            .text(record.bytes_out)
            .raw(" / ")
            .text(record.bytes_in)
            .raw("</td><td class=\"num hide-narrow\">")
            .text(record.duration_ms)
            .raw(" ms</td></tr>");
    }
    html.raw("</tbody></table></div>");
    let more = log.records.len().saturating_sub(SHOWN) as u64 + log.records_dropped;
    if more > 0 {
        html.raw("<p class=\"muted\">")
            .text(more)
            .raw(" more connections: see the run's egress result.</p>");
    }
    html
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodus_core::egress::EgressRecord;

    #[test]
    fn the_section_lists_connections_escaped() {
        let mut log = EgressLog::default();
        let record = |host: &str, verdict: &str, rule: &str| EgressRecord {
            time: "2026-12-01T10:00:00Z".into(),
            host: host.into(),
            port: 443,
            address: None,
            verdict: verdict.into(),
            rule: rule.into(),
            bytes_out: 7,
            bytes_in: 9,
            duration_ms: 4,
        };
        log.push(record("files.test", "allowed", "spec.network.allow[0]"), 10);
        log.push(
            record("<script>x</script>", "refused", "\"<b> is not in\""),
            10,
        );
        let shown = render(&log).into_string();
        assert!(
            shown.contains("1 allowed, 1 refused; 14 bytes out, 18 bytes in"),
            "{shown}"
        );
        assert!(
            shown.contains("files.test:443") && shown.contains("7 / 9"),
            "{shown}"
        );
        assert!(
            !shown.contains("<script>") && !shown.contains("<b>"),
            "{shown}"
        );
        assert!(
            shown.contains("&lt;script&gt;x&lt;/script&gt;:443"),
            "{shown}"
        );
        let none = render(&EgressLog::default()).into_string();
        assert!(none.contains("No connections."), "{none}");
    }
}
