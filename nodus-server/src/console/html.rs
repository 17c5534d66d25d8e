//! HTML built safely: markup enters only as `&'static str` literals written in this crate,
//! and everything else (names, answers, inputs, command output, messages) goes through
//! [`escape`], so that what a model or a user wrote is always shown as text.

use std::fmt::{self, Write as _};

pub use crate::download::percent_encode;

/// A piece of HTML under construction.
#[derive(Default)]
pub struct Html(String);

impl Html {
    /// Empty.
    pub fn new() -> Self {
        Html(String::new())
    }

    /// Markup written in the code: a literal, never data.
    pub fn raw(&mut self, markup: &'static str) -> &mut Self {
        self.0.push_str(markup);
        self
    }

    /// Text, escaped for an element's content and for a quoted attribute value.
    pub fn text(&mut self, text: impl fmt::Display) -> &mut Self {
        let mut plain = String::new();
        let _ = write!(plain, "{text}");
        escape_into(&mut self.0, &plain);
        self
    }

    /// A path segment of a link: percent-encoded, then escaped.
    pub fn segment(&mut self, segment: &str) -> &mut Self {
        self.0.push_str(&percent_encode(segment));
        self
    }

    /// Another piece built the same way.
    pub fn append(&mut self, other: Html) -> &mut Self {
        self.0.push_str(&other.0);
        self
    }

    /// The HTML text.
    pub fn into_string(self) -> String {
        self.0
    }
}

/// `text` with `&`, `<`, `>`, `"` and `'` replaced by entities.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    escape_into(&mut out, text);
    out
}

fn escape_into(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_is_escaped_markup_is_not() {
        let mut html = Html::new();
        html.raw("<p title=\"")
            .text("\"><script>alert(1)</script>")
            .raw("\">")
            .text("<img src=x onerror='alert(1)'> & co")
            .raw("</p>");
        assert_eq!(
            html.into_string(),
            "<p title=\"&quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;\">\
             &lt;img src=x onerror=&#39;alert(1)&#39;&gt; &amp; co</p>"
        );
        assert_eq!(escape("a<b>\"c'&"), "a&lt;b&gt;&quot;c&#39;&amp;");
    }

    #[test]
    fn segments_are_percent_encoded() {
        assert_eq!(percent_encode("run-1.a_b~"), "run-1.a_b~");
        assert_eq!(
            percent_encode("a/b?c=\"<d>\" é"),
            "a%2Fb%3Fc%3D%22%3Cd%3E%22%20%C3%A9"
        );
        let mut html = Html::new();
        html.raw("<a href=\"/console/p/")
            .segment("x\" onclick=\"y")
            .raw("\">");
        assert_eq!(
            html.into_string(),
            "<a href=\"/console/p/x%22%20onclick%3D%22y\">"
        );
    }
}
