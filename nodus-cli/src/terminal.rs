//! Text from runs shown on a terminal: control characters in command output (clear screen,
//! window titles, fake colours) are shown as visible escapes instead of being obeyed; piped
//! output keeps its bytes as they are.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::io::IsTerminal as _;

/// Whether standard output is a terminal.
pub fn stdout_is_terminal() -> bool {
    std::io::stdout().is_terminal()
}

/// `text` as printed: escaped (see [`escape_controls`]) when it goes to a terminal, as it is
/// otherwise.
pub fn shown(text: &str, terminal: bool) -> Cow<'_, str> {
    if terminal {
        escape_controls(text)
    } else {
        Cow::Borrowed(text)
    }
}

/// Every control character but newline and tab made visible: C0 controls and DEL in caret
/// notation (ESC is `^[`, carriage return `^M`, DEL `^?`), C1 controls as `\u{9b}`.
pub fn escape_controls(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut shown = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if !needs_escape(c) {
            shown.push(c);
        } else if c == '\u{7f}' {
            shown.push_str("^?");
        } else if u32::from(c) < 0x20 {
            shown.push('^');
            shown.push(char::from(b'@' + c as u8));
        } else {
            let _ = write!(shown, "\\u{{{:x}}}", u32::from(c));
        }
    }
    Cow::Owned(shown)
}

fn needs_escape(c: char) -> bool {
    c.is_control() && c != '\n' && c != '\t'
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_other_than_newline_and_tab_are_made_visible() {
        assert_eq!(escape_controls("plain\ttext\n"), "plain\ttext\n");
        assert!(matches!(escape_controls("plain"), Cow::Borrowed(_)));
        // Clear screen, a window title, a fake colour, a carriage return, DEL, NUL, CSI (C1).
        assert_eq!(
            escape_controls("\u{1b}[2J\u{1b}]0;pwned\u{7}\u{1b}[32mok\u{1b}[0m\r\u{7f}\0\u{9b}1m"),
            "^[[2J^[]0;pwned^G^[[32mok^[[0m^M^?^@\\u{9b}1m"
        );
        assert_eq!(escape_controls("héllo ✓"), "héllo ✓", "text is not control");
    }

    #[test]
    fn only_a_terminal_gets_the_escapes() {
        let text = "\u{1b}[2Jcleared";
        assert_eq!(shown(text, true), "^[[2Jcleared");
        assert_eq!(shown(text, false), text, "piped bytes stay as they are");
    }
}
