//! Docker's variable substitution within one word.
//!
//! The parser leaves `$` references untouched so the builder can expand them with the values
//! in scope at each instruction (ARG and ENV change as the file goes on). This follows Docker's
//! shell lexer for the forms people use in Dockerfiles: `$NAME`, `${NAME}`, `${NAME:-word}`,
//! `${NAME-word}`, `${NAME:+word}`, `${NAME+word}`, and `\$` for a literal dollar. Other
//! backslashes are kept as written, because the parser has already removed quoting from ENV
//! and ARG values and COPY paths are taken literally. Docker's special parameters (`$$`, `$@`,
//! ...) are not expanded: a `$` not followed by a name is kept literally.

use crate::error::SubstituteError;

/// Longest expansion of one word (an instruction is at most 256 KiB as written).
pub const MAX_EXPANDED: usize = 256 << 10;

/// Docker's variable substitution in a word: $NAME, ${NAME}, ${NAME:-default}, ${NAME:+alt},
/// with `\$` an escaped dollar. Unset names become "". `lookup` answers a name's value.
///
/// The forms without a colon (`${NAME-default}`, `${NAME+alt}`) test "set" rather than
/// "set and non-empty", as in the shell. The word after a modifier is itself expanded.
pub fn substitute(word: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, SubstituteError> {
    let mut expander = Expander { chars: word.chars().collect(), pos: 0, word, lookup };
    expander.expand_until(None)
}

/// What a `${NAME<op>word}` modifier does with `word`.
#[derive(Clone, Copy)]
enum Modifier {
    /// `-` / `:-`: use `word` when the variable is not set (or empty, with the colon).
    Default,
    /// `+` / `:+`: use `word` when the variable is set (and non-empty, with the colon).
    Alternative,
}

struct Expander<'a> {
    chars: Vec<char>,
    pos: usize,
    word: &'a str,
    lookup: &'a dyn Fn(&str) -> Option<String>,
}

impl Expander<'_> {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn next_char(&mut self) -> Option<char> {
        let c = self.peek();
        if c.is_some() {
            self.pos += 1;
        }
        c
    }

    fn unterminated(&self) -> SubstituteError {
        SubstituteError::Unterminated { word: self.word.to_string() }
    }

    /// Expands up to `stop` (left unconsumed), or to the end of the word when `stop` is `None`.
    /// A modifier's word is expanded with `stop = Some('}')`, which is how `${A:-${B}}` nests:
    /// the inner `${` consumes its own `}` before this loop sees it.
    fn expand_until(&mut self, stop: Option<char>) -> Result<String, SubstituteError> {
        let mut out = String::new();
        while let Some(c) = self.peek() {
            if Some(c) == stop {
                return Ok(out);
            }
            self.pos += 1;
            match c {
                '\\' if self.peek() == Some('$') => {
                    self.pos += 1;
                    out.push('$');
                }
                '$' => out.push_str(&self.dollar()?),
                _ => out.push(c),
            }
            // Checked as it grows: a word of many references to a long value would otherwise
            // take the memory of the whole product first.
            if out.len() > MAX_EXPANDED {
                return Err(SubstituteError::TooLong { word: self.word.chars().take(80).collect() });
            }
        }
        match stop {
            Some(_) => Err(self.unterminated()),
            None => Ok(out),
        }
    }

    /// Expands what follows a `$` that has just been consumed.
    fn dollar(&mut self) -> Result<String, SubstituteError> {
        match self.peek() {
            Some('{') => {
                self.pos += 1;
                self.braced()
            }
            Some(c) if c == '_' || c.is_ascii_alphanumeric() => {
                let name = self.name();
                Ok(self.value(&name).unwrap_or_default())
            }
            // Like the shell: a lone `$` (at the end, before a space, `/`, ...) is literal.
            _ => Ok("$".to_string()),
        }
    }

    /// Reads a name as Docker does: a run of digits (a positional parameter), or letters,
    /// digits and `_`.
    fn name(&mut self) -> String {
        let start = self.pos;
        let digits_only = self.peek().is_some_and(|c| c.is_ascii_digit());
        while let Some(c) = self.peek() {
            let fits = if digits_only { c.is_ascii_digit() } else { c == '_' || c.is_ascii_alphanumeric() };
            if !fits {
                break;
            }
            self.pos += 1;
        }
        self.chars[start..self.pos].iter().collect()
    }

    /// Expands the inside of `${...}`, the `${` already consumed.
    fn braced(&mut self) -> Result<String, SubstituteError> {
        let name = self.name();
        let Some(c) = self.next_char() else {
            return Err(self.unterminated());
        };
        if name.is_empty() {
            return Err(SubstituteError::BadName { word: self.word.to_string() });
        }
        match c {
            '}' => Ok(self.value(&name).unwrap_or_default()),
            '-' => self.modified(&name, Modifier::Default, false),
            '+' => self.modified(&name, Modifier::Alternative, false),
            ':' => match self.next_char() {
                Some('-') => self.modified(&name, Modifier::Default, true),
                Some('+') => self.modified(&name, Modifier::Alternative, true),
                Some(modifier) => Err(self.unsupported(modifier)),
                None => Err(self.unterminated()),
            },
            modifier => Err(self.unsupported(modifier)),
        }
    }

    fn unsupported(&self, modifier: char) -> SubstituteError {
        SubstituteError::UnsupportedModifier { word: self.word.to_string(), modifier }
    }

    /// Applies a modifier; `colon` makes an empty value count as unset, as in the shell.
    fn modified(&mut self, name: &str, modifier: Modifier, colon: bool) -> Result<String, SubstituteError> {
        let word = self.expand_until(Some('}'))?;
        self.pos += 1; // the closing `}`
        let value = self.value(name);
        let set = match &value {
            Some(v) => !colon || !v.is_empty(),
            None => false,
        };
        Ok(match (modifier, set) {
            (Modifier::Default, true) => value.unwrap_or_default(),
            (Modifier::Default, false) | (Modifier::Alternative, true) => word,
            (Modifier::Alternative, false) => String::new(),
        })
    }

    fn value(&self, name: &str) -> Option<String> {
        (self.lookup)(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "A" => Some("a".to_string()),
            "EMPTY" => Some(String::new()),
            "B" => Some("bee".to_string()),
            _ => None,
        }
    }

    fn sub(word: &str) -> Result<String, SubstituteError> {
        substitute(word, &env)
    }

    #[test]
    fn plain_and_braced_names() {
        assert_eq!(sub("$A").unwrap(), "a");
        assert_eq!(sub("${A}").unwrap(), "a");
        assert_eq!(sub("x$A/y").unwrap(), "xa/y");
        assert_eq!(sub("${A}b").unwrap(), "ab");
        assert_eq!(sub("$Ab").unwrap(), "", "the name runs on through letters");
        assert_eq!(sub("/usr/${B}/$A:$UNSET").unwrap(), "/usr/bee/a:");
        assert_eq!(sub("no dollars").unwrap(), "no dollars");
    }

    #[test]
    fn expansions_are_bounded() {
        let big = "x".repeat(100 << 10);
        let lookup = |name: &str| (name == "BIG").then(|| big.clone());
        assert_eq!(substitute("$BIG$BIG", &lookup).unwrap().len(), 200 << 10);
        let err = substitute("$BIG$BIG$BIG", &lookup).unwrap_err();
        assert!(matches!(err, SubstituteError::TooLong { .. }), "{err}");
        assert!(err.to_string().contains("more than 256 KiB"), "{err}");
    }

    #[test]
    fn unset_names_become_empty() {
        assert_eq!(sub("[$UNSET]").unwrap(), "[]");
        assert_eq!(sub("[${UNSET}]").unwrap(), "[]");
    }

    #[test]
    fn default_modifier() {
        assert_eq!(sub("${A:-d}").unwrap(), "a");
        assert_eq!(sub("${UNSET:-d}").unwrap(), "d");
        assert_eq!(sub("${EMPTY:-d}").unwrap(), "d");
        assert_eq!(sub("${EMPTY-d}").unwrap(), "", "without the colon an empty value counts as set");
        assert_eq!(sub("${UNSET-d}").unwrap(), "d");
        assert_eq!(sub("${UNSET:-}").unwrap(), "");
    }

    #[test]
    fn alternative_modifier() {
        assert_eq!(sub("${A:+x}").unwrap(), "x");
        assert_eq!(sub("${UNSET:+x}").unwrap(), "");
        assert_eq!(sub("${EMPTY:+x}").unwrap(), "");
        assert_eq!(sub("${EMPTY+x}").unwrap(), "x");
    }

    #[test]
    fn modifier_words_are_expanded_and_nest() {
        assert_eq!(sub("${UNSET:-$B}").unwrap(), "bee");
        assert_eq!(sub("${UNSET:-${B}/x}").unwrap(), "bee/x");
        assert_eq!(sub("${UNSET:-${ALSO_UNSET:-deep}}!").unwrap(), "deep!");
        assert_eq!(sub("${A:+[$B]}").unwrap(), "[bee]");
    }

    #[test]
    fn escaped_dollar_is_literal() {
        assert_eq!(sub("\\$A").unwrap(), "$A");
        assert_eq!(sub("\\${A}").unwrap(), "${A}");
        assert_eq!(sub("a\\b").unwrap(), "a\\b", "other backslashes are kept");
    }

    #[test]
    fn lone_dollar_is_literal() {
        assert_eq!(sub("cost$").unwrap(), "cost$");
        assert_eq!(sub("$ $/").unwrap(), "$ $/");
        assert_eq!(sub("$$").unwrap(), "$$");
    }

    #[test]
    fn positional_names_read_digits_only() {
        assert_eq!(sub("$1A").unwrap(), "A");
    }

    #[test]
    fn unterminated_brace_is_an_error() {
        assert_eq!(sub("${A").unwrap_err(), SubstituteError::Unterminated { word: "${A".to_string() });
        assert_eq!(sub("x${").unwrap_err(), SubstituteError::Unterminated { word: "x${".to_string() });
        assert_eq!(sub("${A:-d").unwrap_err(), SubstituteError::Unterminated { word: "${A:-d".to_string() });
        assert_eq!(sub("${A:").unwrap_err(), SubstituteError::Unterminated { word: "${A:".to_string() });
        assert!(sub("${A").unwrap_err().to_string().contains("unterminated ${"));
    }

    #[test]
    fn bad_names_and_modifiers_are_errors() {
        assert_eq!(sub("${}").unwrap_err(), SubstituteError::BadName { word: "${}".to_string() });
        assert_eq!(sub("${-x}").unwrap_err(), SubstituteError::BadName { word: "${-x}".to_string() });
        assert_eq!(
            sub("${A?oops}").unwrap_err(),
            SubstituteError::UnsupportedModifier { word: "${A?oops}".to_string(), modifier: '?' }
        );
        assert_eq!(
            sub("${A:?oops}").unwrap_err(),
            SubstituteError::UnsupportedModifier { word: "${A:?oops}".to_string(), modifier: '?' }
        );
        assert_eq!(
            sub("${A B}").unwrap_err(),
            SubstituteError::UnsupportedModifier { word: "${A B}".to_string(), modifier: ' ' }
        );
    }
}
