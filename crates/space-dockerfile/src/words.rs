//! Splitting and unquoting the arguments of ENV and ARG, following Docker's `parseWords` and
//! its shell lexer, minus the variable expansion which [`crate::substitute`] does later.

use std::iter::Peekable;
use std::str::Chars;

/// A quote that was opened and never closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unterminated(pub char);

/// Splits on whitespace outside quotes. Quotes and backslash escapes stay in the words (they
/// are removed by [`unquote`] once the `NAME=` part is split off), as in Docker's `parseWords`.
pub(crate) fn split_words(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if quote.is_none() && c.is_whitespace() {
            if in_word {
                words.push(std::mem::take(&mut word));
                in_word = false;
            }
            continue;
        }
        in_word = true;
        word.push(c);
        match quote {
            Some(q) if c == q => quote = None,
            None if c == '\'' || c == '"' => quote = Some(c),
            // Inside single quotes a backslash is an ordinary character.
            Some('\'') => {}
            _ if c == '\\' => word.extend(chars.next()),
            _ => {}
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// Removes quotes and backslash escapes from an ENV or ARG value, as Docker's lexer does.
///
/// Dollars that Docker would keep literal (escaped as `\$`, or inside single quotes) come out
/// as `\$`, so running the value through [`crate::substitute`] leaves them alone while still
/// expanding the others. One corner differs from Docker: an escaped backslash directly before
/// a `$` (`\\$A`) yields a literal `$A` rather than a backslash followed by A's value.
pub(crate) fn unquote(value: &str) -> Result<String, Unterminated> {
    let mut out = String::with_capacity(value.len());
    let mut chars = value.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('$') => out.push_str("\\$"),
                Some(next) => out.push(next),
                None => {} // Docker drops a trailing escape character.
            },
            '\'' => single_quoted(&mut chars, &mut out)?,
            '"' => double_quoted(&mut chars, &mut out)?,
            _ => out.push(c),
        }
    }
    Ok(out)
}

/// Copies up to the closing `'`: nothing is special inside, so `$` is protected as `\$`.
fn single_quoted(chars: &mut Peekable<Chars<'_>>, out: &mut String) -> Result<(), Unterminated> {
    for c in chars.by_ref() {
        match c {
            '\'' => return Ok(()),
            '$' => out.push_str("\\$"),
            _ => out.push(c),
        }
    }
    Err(Unterminated('\''))
}

/// Copies up to the closing `"`: a backslash escapes only `"`, `\` and `$`, as in the shell.
fn double_quoted(chars: &mut Peekable<Chars<'_>>, out: &mut String) -> Result<(), Unterminated> {
    while let Some(c) = chars.next() {
        match c {
            '"' => return Ok(()),
            '\\' => match chars.peek().copied() {
                Some('$') => {
                    chars.next();
                    out.push_str("\\$");
                }
                Some(escaped @ ('"' | '\\')) => {
                    chars.next();
                    out.push(escaped);
                }
                _ => out.push('\\'),
            },
            _ => out.push(c),
        }
    }
    Err(Unterminated('"'))
}

/// Whether `name` can be an ENV or ARG name: `[A-Za-z_][A-Za-z0-9_]*`, what a shell accepts,
/// so the builder can export every variable to RUN steps.
pub(crate) fn is_valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_outside_quotes_and_keeps_them() {
        assert_eq!(split_words("  A=1   B=\"x y\" C='p q'\tD=a\\ b "), vec!["A=1", "B=\"x y\"", "C='p q'", "D=a\\ b"]);
        assert_eq!(split_words("A=\"in \\\" quote\" B"), vec!["A=\"in \\\" quote\"", "B"]);
        assert_eq!(split_words("A='back\\' B"), vec!["A='back\\'", "B"]);
        assert_eq!(split_words(""), Vec::<String>::new());
        assert_eq!(split_words("''"), vec!["''"]);
    }

    #[test]
    fn unquotes_like_the_shell() {
        assert_eq!(unquote("plain").unwrap(), "plain");
        assert_eq!(unquote("\"v 2\"").unwrap(), "v 2");
        assert_eq!(unquote("'v 2'").unwrap(), "v 2");
        assert_eq!(unquote("a\\ b").unwrap(), "a b");
        assert_eq!(unquote("pre\"mid\"'post'").unwrap(), "premidpost");
        assert_eq!(unquote("\"a\\\"b\\\\c\\d\"").unwrap(), "a\"b\\c\\d");
        assert_eq!(unquote("'a\\b'").unwrap(), "a\\b");
        assert_eq!(unquote("trailing\\").unwrap(), "trailing");
        assert_eq!(unquote("").unwrap(), "");
    }

    #[test]
    fn keeps_dollars_for_substitution_and_protects_literal_ones() {
        assert_eq!(unquote("$HOME/bin").unwrap(), "$HOME/bin");
        assert_eq!(unquote("\"$HOME\"").unwrap(), "$HOME");
        assert_eq!(unquote("\\$HOME").unwrap(), "\\$HOME");
        assert_eq!(unquote("\"\\$HOME\"").unwrap(), "\\$HOME");
        assert_eq!(unquote("'$HOME'").unwrap(), "\\$HOME");
    }

    #[test]
    fn reports_unterminated_quotes() {
        assert_eq!(unquote("\"open"), Err(Unterminated('"')));
        assert_eq!(unquote("'open"), Err(Unterminated('\'')));
    }

    #[test]
    fn validates_names() {
        assert!(is_valid_name("PATH"));
        assert!(is_valid_name("_x9"));
        assert!(!is_valid_name(""));
        assert!(!is_valid_name("9x"));
        assert!(!is_valid_name("A-B"));
        assert!(!is_valid_name("\"A\""));
    }
}
