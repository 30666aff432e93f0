//! Turning the text into logical lines, one per instruction: parser directives at the top,
//! comment and blank lines dropped, and `\` continuations joined the way Docker joins them.

use std::iter::{Enumerate, Peekable};
use std::str::Lines;

use crate::error::ParseError;

/// Longest instruction accepted, after joining continuation lines. Bounds the work and memory
/// one runaway continuation (a stray `\` at the end of every line) can cost.
pub(crate) const MAX_INSTRUCTION: usize = 256 * 1024;

/// Parser directives Docker knows. Any other `# name=value` at the top is an ordinary comment
/// and, as in Docker, ends the directive block.
const DIRECTIVES: [&str; 3] = ["syntax", "escape", "check"];

/// One instruction's text before it is split into keyword and arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LogicalLine {
    /// 1-based line where the instruction starts.
    pub line: usize,
    /// Each physical piece trimmed and joined with a single space: stable under re-indenting,
    /// for logs and cache keys.
    pub text: String,
    /// The pieces concatenated exactly as Docker does (the `\` and any blanks after it removed,
    /// everything else kept), so that `echo a\` + `b` means `echo ab` as it does in Docker.
    pub content: String,
}

/// Yields logical lines in file order, so the first error reported is the first in the file.
pub(crate) struct LogicalLines<'a> {
    lines: Peekable<Enumerate<Lines<'a>>>,
    /// Docker only looks for directives until the first line that is not one.
    directives_done: bool,
    directives_seen: Vec<String>,
}

impl<'a> LogicalLines<'a> {
    pub(crate) fn new(text: &'a str) -> Self {
        Self { lines: text.lines().enumerate().peekable(), directives_done: false, directives_seen: Vec::new() }
    }

    fn directive(&mut self, line: usize, trimmed: &str) -> Result<(), ParseError> {
        let Some((name, value)) = split_directive(trimmed) else {
            self.directives_done = true;
            return Ok(());
        };
        let name = name.to_ascii_lowercase();
        if !DIRECTIVES.contains(&name.as_str()) {
            self.directives_done = true;
            return Ok(());
        }
        if self.directives_seen.contains(&name) {
            return Err(ParseError::new(line, format!("only one {name} parser directive can be used")));
        }
        if name == "escape" && value != "\\" {
            return Err(ParseError::new(line, "only the default escape character \\ is supported"));
        }
        self.directives_seen.push(name);
        Ok(())
    }

    /// Collects the instruction starting at `first` (already left-trimmed) and its continuations.
    fn instruction(&mut self, line: usize, first: &str) -> Result<LogicalLine, ParseError> {
        let mut joined = LogicalLine { line, text: String::new(), content: String::new() };
        let mut more = push_piece(&mut joined, first)?;
        while more {
            let Some((_, raw)) = self.lines.next() else { break };
            let trimmed = raw.trim_start();
            // Docker drops comment and blank lines inside a continuation.
            if trimmed.starts_with('#') || trimmed.is_empty() {
                continue;
            }
            more = push_piece(&mut joined, raw)?;
        }
        Ok(joined)
    }
}

impl Iterator for LogicalLines<'_> {
    type Item = Result<LogicalLine, ParseError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let (index, raw) = self.lines.next()?;
            let line = index + 1;
            let trimmed = raw.trim_start();
            if !self.directives_done
                && let Err(error) = self.directive(line, trimmed)
            {
                return Some(Err(error));
            }
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            return Some(self.instruction(line, trimmed));
        }
    }
}

/// Appends one physical line; returns whether it ends in a continuation.
fn push_piece(joined: &mut LogicalLine, piece: &str) -> Result<bool, ParseError> {
    let (body, continues) = split_continuation(piece);
    joined.content.push_str(body);
    let trimmed = body.trim();
    if !trimmed.is_empty() {
        if !joined.text.is_empty() {
            joined.text.push(' ');
        }
        joined.text.push_str(trimmed);
    }
    if joined.content.len() > MAX_INSTRUCTION {
        return Err(ParseError::new(joined.line, "the instruction is longer than 256 KiB"));
    }
    Ok(continues)
}

/// Docker's continuation rule: the escape character followed only by blanks ends the line.
fn split_continuation(piece: &str) -> (&str, bool) {
    match piece.trim_end_matches([' ', '\t']).strip_suffix('\\') {
        Some(body) => (body, true),
        None => (piece, false),
    }
}

/// Matches Docker's `#[ \t]*name[ \t]*=[ \t]*value` directive form.
fn split_directive(trimmed: &str) -> Option<(&str, &str)> {
    let rest = trimmed.strip_prefix('#')?.trim_start_matches([' ', '\t']);
    let name_end = rest.find(|c: char| !c.is_ascii_alphanumeric()).unwrap_or(rest.len());
    let (name, rest) = rest.split_at(name_end);
    if !name.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return None;
    }
    let value = rest.trim_start_matches([' ', '\t']).strip_prefix('=')?.trim_matches([' ', '\t']);
    (!value.is_empty()).then_some((name, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logical(text: &str) -> Result<Vec<LogicalLine>, ParseError> {
        LogicalLines::new(text).collect()
    }

    fn line(line: usize, text: &str, content: &str) -> LogicalLine {
        LogicalLine { line, text: text.to_string(), content: content.to_string() }
    }

    #[test]
    fn skips_comments_and_blank_lines() {
        let lines = logical("# hello\n\n  FROM a  \n   # indented comment\nRUN b # not a comment\n").unwrap();
        assert_eq!(
            lines,
            vec![line(3, "FROM a", "FROM a  "), line(5, "RUN b # not a comment", "RUN b # not a comment")]
        );
    }

    #[test]
    fn joins_continuations_like_docker() {
        let lines = logical("RUN a \\\n    b\\  \n\n  # comment\nc\nRUN d").unwrap();
        assert_eq!(lines, vec![line(1, "RUN a b c", "RUN a     bc"), line(6, "RUN d", "RUN d")]);
    }

    #[test]
    fn continuation_at_end_of_file_ends_the_instruction() {
        assert_eq!(logical("RUN a \\\n").unwrap(), vec![line(1, "RUN a", "RUN a ")]);
    }

    #[test]
    fn handles_crlf() {
        assert_eq!(logical("RUN a \\\r\n  b\r\n").unwrap(), vec![line(1, "RUN a b", "RUN a   b")]);
    }

    #[test]
    fn accepts_syntax_and_default_escape_directives() {
        let lines = logical("# syntax=docker/dockerfile:1\n#escape = \\\nFROM a\n").unwrap();
        assert_eq!(lines, vec![line(3, "FROM a", "FROM a")]);
    }

    #[test]
    fn refuses_another_escape_character() {
        let error = logical("# syntax=docker/dockerfile:1\n# escape=`\nFROM a\n").unwrap_err();
        assert_eq!(error.line, 2);
        assert!(error.message.contains("only the default escape character \\ is supported"), "{error}");
    }

    #[test]
    fn refuses_a_repeated_directive() {
        let error = logical("# escape=\\\n# escape=\\\nFROM a\n").unwrap_err();
        assert_eq!(error.line, 2);
        assert!(error.message.contains("only one escape parser directive"), "{error}");
    }

    #[test]
    fn directives_after_the_top_are_comments() {
        assert_eq!(logical("FROM a\n# escape=`\n").unwrap(), vec![line(1, "FROM a", "FROM a")]);
        assert_eq!(logical("\n# escape=`\nFROM a\n").unwrap(), vec![line(3, "FROM a", "FROM a")]);
        assert_eq!(logical("# a comment\n# escape=`\nFROM a\n").unwrap(), vec![line(3, "FROM a", "FROM a")]);
    }

    #[test]
    fn refuses_an_oversized_instruction() {
        let piece = format!("{} \\\n", "x".repeat(1024));
        let text = format!("FROM a\nRUN {}", piece.repeat(300));
        let error = logical(&text).unwrap_err();
        assert_eq!(error.line, 2);
        assert!(error.message.contains("longer than 256 KiB"), "{error}");
    }
}
