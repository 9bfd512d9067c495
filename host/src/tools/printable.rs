//! What the commands print of the cluster, made safe for a terminal. An
//! annotation, a record, an image or an error's message is whatever its
//! writer put there: a terminal's escape sequence (`ESC [2J` clears the
//! screen, others retitle the window or rewrite what was printed), a
//! carriage return that overwrites the line, a newline that makes up a line
//! of the command's own (a forged `approved` under `status`), or a
//! bidirectional override that shows text in another order than it runs.
//! Every command writes such text through [`printable`] (one value) or
//! [`printable_lines`] (a text of its own whose lines are its own).
//! JSON output needs neither: JSON escapes them.

use std::borrow::Cow;

/// Whether `c` is written escaped: a control character (C0, DEL, C1) or a
/// bidirectional mark, embedding, override or isolate.
fn unprintable(c: char) -> bool {
    c.is_control() || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` with every character a terminal would act on written as its
/// escape (`\n`, `\u{1b}`), anything else as it is.
pub fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(unprintable) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if unprintable(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// [`printable`] of each line of `text`, its line breaks kept: for a text
/// a command made, whose lines are its own.
pub fn printable_lines(text: &str) -> Cow<'_, str> {
    if !text.chars().any(|c| c != '\n' && unprintable(c)) {
        return Cow::Borrowed(text);
    }
    let lines: Vec<Cow<'_, str>> = text.split('\n').map(printable).collect();
    Cow::Owned(lines.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_terminal_acts_on_is_written_escaped_and_nothing_else() {
        assert_eq!(printable("app-865f59c2fb, ümlaut 名前"), "app-865f59c2fb, ümlaut 名前");
        assert!(matches!(printable("plain"), Cow::Borrowed(_)));
        assert_eq!(printable("a\u{1b}[2Jb"), "a\\u{1b}[2Jb");
        assert_eq!(printable("one\r\ntwo\tthree"), "one\\r\\ntwo\\tthree");
        assert_eq!(printable("\u{9b}31m"), "\\u{9b}31m", "a C1 control sequence introducer");
        assert_eq!(
            printable("abc\u{202e}fed"),
            "abc\\u{202e}fed",
            "a right-to-left override"
        );
        assert_eq!(
            printable_lines("line one\nline\u{7} two\n"),
            "line one\nline\\u{7} two\n"
        );
    }
}
