//! The text `history` and `diff` print: what they read off the cluster
//! (names, images, config values) written [`printable`], before any colour.

use super::diff::Diff;
use super::kept::{History, State};
use crate::tools::printable;

/// Colour, when the output is a terminal and NO_COLOR is not set.
#[derive(Debug, Clone, Copy)]
pub struct Style {
    pub colour: bool,
}

impl Style {
    pub fn for_stdout() -> Style {
        use std::io::IsTerminal;
        Style {
            colour: std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        }
    }

    fn paint(&self, code: &str, text: &str) -> String {
        if self.colour {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    }
}

fn age(seconds: Option<i64>) -> String {
    let Some(s) = seconds else { return "?".into() };
    match s {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// The history as a table: one line per revision, one indented line per
/// source.
pub fn render_history(history: &History, style: Style) -> String {
    let rows: Vec<[String; 4]> = history
        .revisions
        .iter()
        .map(|r| {
            let mut note = String::new();
            if r.current {
                note.push_str("current");
            }
            if !r.rollback_of.is_empty() {
                let was: Vec<String> = r.rollback_of.iter().map(i64::to_string).collect();
                if !note.is_empty() {
                    note.push_str(", ");
                }
                note.push_str(&format!("rollback to revision {}'s template", was.join(", ")));
            }
            [
                r.revision.to_string(),
                age(r.age_seconds),
                printable(&r.images.join(", ")).into_owned(),
                note,
            ]
        })
        .collect();
    let header = ["REVISION", "AGE", "IMAGES", ""];
    let width = |i: usize| {
        rows.iter()
            .map(|r| r[i].len())
            .chain([header[i].len()])
            .max()
            .unwrap_or(0)
    };
    let (w0, w1, w2) = (width(0), width(1), width(2));
    let mut out = format!(
        "{} in {}: {} revision(s) kept\n",
        printable(&history.workload),
        printable(&history.namespace),
        history.revisions.len()
    );
    out.push_str(format!("{:w0$}  {:w1$}  {:w2$}", header[0], header[1], header[2]).trim_end());
    out.push('\n');
    for (r, row) in history.revisions.iter().zip(&rows) {
        let line = format!("{:w0$}  {:w1$}  {:w2$}  {}", row[0], row[1], row[2], row[3]);
        let line = line.trim_end();
        out.push_str(&if r.current {
            style.paint("1", line)
        } else {
            line.to_string()
        });
        out.push('\n');
        let sw = r.sources.iter().map(|s| printable(&s.source).len()).max().unwrap_or(0);
        for s in &r.sources {
            let mut detail = printable(&s.state.to_string()).into_owned();
            if let Some(k) = s.keys.as_ref() {
                detail.push_str(&format!(" ({})", printable(&k.describe())));
            } else if matches!(s.state, State::Snapshot { .. }) && r.revision != history.revisions[0].revision {
                detail.push_str(" (new source)");
            }
            let detail = match &s.state {
                State::Collected { .. } | State::Revoked { .. } => style.paint("33", &detail),
                _ if s.keys.as_ref().is_some_and(|k| !k.is_empty()) => style.paint("36", &detail),
                _ => detail,
            };
            out.push_str(&format!("{:w0$}  {:sw$}  {detail}\n", "", printable(&s.source)));
        }
    }
    out
}

pub fn render_diff(diff: &Diff, style: Style) -> String {
    let mut out = String::new();
    for (source, why) in &diff.unknown {
        out.push_str(&format!("# {}: {}\n", printable(source), printable(why)));
    }
    for text in diff.sources.values().chain(diff.template.as_ref()) {
        for line in text.lines() {
            let line = &printable(line);
            let painted = match line.chars().next() {
                Some('+') if !line.starts_with("+++") => style.paint("32", line),
                Some('-') if !line.starts_with("---") => style.paint("31", line),
                Some('@') => style.paint("36", line),
                _ => line.to_string(),
            };
            out.push_str(&painted);
            out.push('\n');
        }
    }
    if !diff.differs() {
        out.push_str(&format!(
            "revisions {} and {} run the same config and template\n",
            diff.from, diff.to
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::kept::{Revision, SourceConfig};
    use super::*;

    /// Finding 9 of eff3694's review: what `history` reads off the cluster
    /// (here an image and a snapshot name, as a template may carry them) is
    /// printed escaped, and its own colour still paints the current row.
    #[test]
    fn history_prints_what_the_revisions_say_escaped() {
        let source = SourceConfig {
            source: "configmap/app".into(),
            state: State::Snapshot {
                snapshot: "app-1\r\u{1b}[2Kapp-forged".into(),
            },
            keys: None,
            values: None,
        };
        let history = History {
            workload: "deployment/web".into(),
            namespace: "shop".into(),
            revisions: vec![Revision {
                revision: 1,
                name: "web-1".into(),
                age_seconds: Some(5),
                current: true,
                rollback_of: Vec::new(),
                images: vec!["nginx:1\u{1b}]0;owned\u{7}".into()],
                sources: vec![source],
                template: serde_json::Value::Null,
            }],
        };
        let plain = render_history(&history, Style { colour: false });
        assert!(plain.chars().all(|c| c == '\n' || !c.is_control()), "{plain:?}");
        assert!(plain.contains("nginx:1\\u{1b}]0;owned\\u{7}"), "{plain}");
        let painted = render_history(&history, Style { colour: true });
        assert_eq!(
            painted.matches('\u{1b}').count(),
            2,
            "only the bold row's own: {painted:?}"
        );
    }
}
