//! An incremental parser of server-sent events (the `text/event-stream` format both providers
//! stream in): bytes in, complete events out, whatever the chunking.

/// One event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Event {
    /// The `event:` field, if any.
    pub event: Option<String>,
    /// The `data:` lines, joined with newlines.
    pub data: String,
}

/// Bytes received and not yet a complete line, and the event being built.
#[derive(Debug, Default)]
pub(crate) struct Parser {
    pending: Vec<u8>,
    event: Option<String>,
    data: Option<String>,
}

/// A line that is not UTF-8.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NotUtf8;

impl Parser {
    /// Feed bytes; the events they complete come out in order.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<Event>, NotUtf8> {
        self.pending.extend_from_slice(bytes);
        let mut events = Vec::new();
        let mut start = 0;
        while let Some(offset) = self.pending[start..].iter().position(|&b| b == b'\n') {
            let end = start + offset;
            let mut line = &self.pending[start..end];
            if let Some(stripped) = line.strip_suffix(b"\r") {
                line = stripped;
            }
            let line = std::str::from_utf8(line).map_err(|_| NotUtf8)?.to_string();
            start = end + 1;
            if let Some(event) = self.line(&line) {
                events.push(event);
            }
        }
        self.pending.drain(..start);
        Ok(events)
    }

    fn line(&mut self, line: &str) -> Option<Event> {
        if line.is_empty() {
            let data = self.data.take();
            let event = self.event.take();
            return data.map(|data| Event { event, data });
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "event" => self.event = Some(value.to_string()),
            "data" => match &mut self.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.data = Some(value.to_string()),
            },
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_come_out_whatever_the_chunking() {
        let stream = "event: a\r\ndata: {\"x\":1}\r\n\r\n: comment\n\ndata: one\ndata: two\n\nevent: b\ndata:é\n\n";
        let expected = vec![
            Event {
                event: Some("a".into()),
                data: "{\"x\":1}".into(),
            },
            Event {
                event: None,
                data: "one\ntwo".into(),
            },
            Event {
                event: Some("b".into()),
                data: "é".into(),
            },
        ];
        for size in 1..stream.len() {
            let mut parser = Parser::default();
            let mut events = Vec::new();
            for chunk in stream.as_bytes().chunks(size) {
                events.extend(parser.push(chunk).expect("utf-8"));
            }
            assert_eq!(events, expected, "chunks of {size}");
        }
    }

    #[test]
    fn an_unfinished_event_is_not_emitted_and_bad_bytes_are_an_error() {
        let mut parser = Parser::default();
        assert_eq!(parser.push(b"data: half"), Ok(vec![]));
        assert_eq!(parser.push(b"\xff\xfe\n"), Err(NotUtf8));
    }
}
